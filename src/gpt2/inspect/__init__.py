"""Looking inside a model: `gpt2 inspect`, and `gpt2.inspect.trace(model, text)` in Python.

    tracing  a traced forward pass: every activation by name, patches, the logit lens, the
             next-token report
    walkthrough  the seeds' walk through the pass, step by step: as text, and as data (walk)
    circuits what heads attend to (head scores) and each part's direct effect on a logit
    patching activation patching: each activation of a site taken from a clean run into a
             corrupted one, the metric of each (logit differences ready made), and its
             first-order estimate from one backward pass (attribution patching)
    generating  a traced generation: the prompt's and every new token's activations, one
                trace over the whole text, computed with the KV cache
    experiments the standard experiments with their data built in: induction, IOI (Wang et
                al. 2023's templates), greater-than (Hanna et al. 2023)
    saes     sparse autoencoders saved by SAELens: read, and their features at a trace's sites
    transcoders  transcoders (a block's MLP replaced by sparse features) saved by circuit-tracer or SAELens
    graphs   attribution graphs over transcoders, circuit-tracer's, pruned and written for its viewer
    interventions  a transcoder feature set, scaled or zeroed and the model run again (circuit-tracer's)
    dashboards  a transcoder feature's top contexts over the windows of a prepared data set
    dictionaries  SAEs and transcoders being trained: SAELens's architectures and losses, their saves
    dictionary_training  training them on activations streamed from the model (`gpt2 train-sae`)
    weights  the weights in TransformerLens's names and shapes, QK and OV circuits kept factored,
             composition scores, and TransformerLens's weight processing (process_weights)
    names    the steps' names: gpt2's, and TransformerLens's hook and short names read as aliases
    figures  its pictures, drawn with matplotlib: attention, the logit lens, the next token

`walkthrough`, `circuits`, `patching`, `generating`, `experiments`, `saes`, `transcoders`, `graphs`, `interventions`,
`dashboards`, `dictionary_training` and `figures` build on `tracing` (`trace(..., saes=...)` splices
SAEs and transcoders into its pass). The names of
`tracing`, `circuits`, `patching`, `generating`, `experiments` and `saes` are this package's
(`gpt2.inspect.trace`, `gpt2.inspect.trace_generation`, ...); `figures` is imported as
`gpt2.inspect.figures`, since it needs matplotlib.
"""

from gpt2.inspect.circuits import HEAD_SCORES, LogitAttribution, head_scores, logit_attribution, repeated_tokens
from gpt2.inspect.dashboards import read_windows, top_contexts
from gpt2.inspect.experiments import CORRUPTIONS, EXPERIMENTS, ExperimentResult, ioi_prompts, run_experiment
from gpt2.inspect.generating import GenerationTrace, trace_generation
from gpt2.inspect.graphs import AttributionGraph, attribution_graph
from gpt2.inspect.interventions import InterventionResult, feature_intervention, steering_vector
from gpt2.inspect.names import BLOCK_STEPS, ON_REQUEST, short_name
from gpt2.inspect.patching import SITES, activation_patching, attribution_patching, logit_diff, normalised_logit_diff
from gpt2.inspect.saes import SAE, load_sae, sae_features, top_features
from gpt2.inspect.tracing import (
    Patch,
    Trace,
    activation_names,
    alternatives,
    logit_lens_top,
    next_token_report,
    token_ids,
    token_label,
    trace,
)
from gpt2.inspect.transcoders import Transcoder, TranscoderSet, load_transcoders
from gpt2.inspect.walkthrough import STEP_ABOUT, STEP_MATH, walk, walkthrough
from gpt2.inspect.weights import (
    FactoredMatrix,
    ProcessedGPT2,
    Weights,
    composition_scores,
    full_ov_circuit,
    full_qk_circuit,
    process_weights,
)

__all__ = [
    "AttributionGraph",
    "attribution_graph",
    "InterventionResult",
    "feature_intervention",
    "steering_vector",
    "read_windows",
    "top_contexts",
    "CORRUPTIONS",
    "FactoredMatrix",
    "ProcessedGPT2",
    "Transcoder",
    "TranscoderSet",
    "Weights",
    "load_transcoders",
    "composition_scores",
    "full_ov_circuit",
    "full_qk_circuit",
    "process_weights",
    "BLOCK_STEPS",
    "EXPERIMENTS",
    "ExperimentResult",
    "GenerationTrace",
    "HEAD_SCORES",
    "LogitAttribution",
    "ON_REQUEST",
    "SAE",
    "SITES",
    "STEP_ABOUT",
    "STEP_MATH",
    "Patch",
    "Trace",
    "activation_names",
    "activation_patching",
    "attribution_patching",
    "alternatives",
    "head_scores",
    "load_sae",
    "ioi_prompts",
    "logit_attribution",
    "logit_diff",
    "logit_lens_top",
    "next_token_report",
    "normalised_logit_diff",
    "repeated_tokens",
    "run_experiment",
    "sae_features",
    "short_name",
    "token_ids",
    "token_label",
    "top_features",
    "trace",
    "trace_generation",
    "walk",
    "walkthrough",
]
