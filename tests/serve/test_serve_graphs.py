"""POST /v1/circuits/graph and /v1/circuits/feature (gpt2.serve.graphs), thin layers over gpt2.inspect:
each answer equals the library's own, called here on the served model (attribution_graph's file
and scores, top_contexts; their math is tested against references in tests/inspect/); the servers
without transcoders or feature data, and the bad requests, get a 400 saying why; `gpt2 serve
--transcoders --feature-data --max-graph-tokens` reaches the server."""

from __future__ import annotations

import httpx
import pytest
from helpers import circuit_tracer_layer, corpus, serving, write_circuit_tracer
from serve_fixtures import ENC, HANG, gpt2_serve, post

from gpt2 import InvalidArgumentError
from gpt2.data import prepare
from gpt2.inspect import attribution_graph, load_transcoders, read_windows, top_contexts
from gpt2.serve import Limits, create_app

PROMPT = "The cat sat on the mat because the cat"
MOST = 16  # the graph server's max_graph_tokens


def random_transcoders(directory, n_embd: int = 48, n_layer: int = 2):
    """A random transcoder set in circuit-tracer's layout for a model of this width (a fifth of the features fire)."""
    layers = {
        i: circuit_tracer_layer(30 + i, jumprelu=i == 1, skip=False, d_model=n_embd, b_enc=-0.8) for i in range(n_layer)
    }
    write_circuit_tracer(directory, layers)
    return directory


@pytest.fixture(scope="module")
def transcoders_dir(tmp_path_factory):
    return random_transcoders(tmp_path_factory.mktemp("graphs") / "tiny-transcoders")


@pytest.fixture(scope="module")
def feature_data(tmp_path_factory):
    """A few thousand characters of the corpus, prepared with GPT-2's tokenizer."""
    directory = tmp_path_factory.mktemp("feature-data")
    (directory / "text.txt").write_text(corpus()[1][:6000])
    prepare([directory / "text.txt"], directory / "data", "gpt2", progress=False, num_workers=1)
    return directory / "data"


@pytest.fixture(scope="module")
def graph_server(models, transcoders_dir, feature_data):
    yield from serving(
        models[1],
        ENC,
        limits=Limits(max_graph_tokens=MOST),
        transcoders=str(transcoders_dir),
        feature_data=str(feature_data),
    )


def test_the_graph_is_attribution_graphs_file_with_its_scores(graph_server, models, transcoders_dir):
    answer = post(graph_server, {"prompt": PROMPT}, "/v1/circuits/graph").json()
    graph = attribution_graph(models[1], PROMPT, load_transcoders(transcoders_dir))
    expected = graph.to_json("playground", scan="tiny-transcoders", prompt=PROMPT)
    assert set(answer) == {*expected, "replacement", "completeness"}
    assert {key: answer[key] for key in expected} == expected
    assert (answer["replacement"], answer["completeness"]) == pytest.approx(graph.scores(), abs=1e-6)
    kinds = {node["feature_type"] for node in answer["nodes"]}
    assert kinds >= {"cross layer transcoder", "embedding", "logit"} and answer["links"]  # a graph, not a stub
    assert answer["metadata"]["prompt_tokens"][0] == "<|endoftext|>" and answer["metadata"]["prompt"] == PROMPT


def test_the_graphs_settings_and_a_prompt_of_ids(graph_server, models, transcoders_dir):
    ids = ENC.encode(PROMPT)
    body = {"prompt": ids, "node_threshold": 0.5, "edge_threshold": 0.9, "max_feature_nodes": 20}
    answer = post(graph_server, body, "/v1/circuits/graph").json()
    graph = attribution_graph(models[1], ids, load_transcoders(transcoders_dir), max_feature_nodes=20)
    expected = graph.to_json("playground", "tiny-transcoders", 0.5, 0.9)
    assert {key: answer[key] for key in expected} == expected
    assert graph.n_features == 20 and answer["metadata"]["node_threshold"] == 0.5
    assert (answer["replacement"], answer["completeness"]) == pytest.approx(graph.scores(), abs=1e-6)


def test_a_features_contexts_are_top_contexts_over_the_feature_data(
    graph_server, models, transcoders_dir, feature_data
):
    graph = post(graph_server, {"prompt": PROMPT}, "/v1/circuits/graph").json()
    node = next(n for n in graph["nodes"] if n["feature_type"] == "cross layer transcoder" and n["layer"] == "1")
    layer, feature, _ = map(int, node["node_id"].split("_"))  # circuit-tracer's "{layer}_{feature}_{position}"
    windows = read_windows(feature_data, 64, 64)
    assert windows.shape[0] >= 10  # several windows of 64 tokens (the model's context is 128)
    tcs = load_transcoders(transcoders_dir)
    for top_k in (None, 3):
        body = {"layer": layer, "feature": feature} | ({} if top_k is None else {"top_k": top_k})
        answer = post(graph_server, body, "/v1/circuits/feature").json()
        expected = top_contexts(models[1], tcs, windows, layer, feature, k=top_k or 10)
        assert answer == {"layer": layer, "feature": feature, "contexts": expected}
        assert len(expected) == (top_k or 10)  # the feature fires on this text, here and there


@pytest.fixture(scope="module")
def capped_server(models, transcoders_dir):
    yield from serving(models[1], ENC, limits=Limits(max_graph_features=7), transcoders=str(transcoders_dir))


def test_a_servers_cap_on_feature_nodes(capped_server, models, transcoders_dir):
    assert Limits().max_graph_features == 4096
    tcs = load_transcoders(transcoders_dir)
    for asked, kept in ((None, 7), (3, 3), (50, 7)):  # the most influential, at most the cap
        answer = post(capped_server, {"prompt": PROMPT, "max_feature_nodes": asked}, "/v1/circuits/graph").json()
        expected = attribution_graph(models[1], PROMPT, tcs, max_feature_nodes=kept).to_json(
            "playground", "tiny-transcoders", prompt=PROMPT
        )
        assert {key: answer[key] for key in expected} == expected
    assert attribution_graph(models[1], PROMPT, tcs).n_features > 7  # the cap is what cut it


@pytest.fixture(scope="module")
def transcoders_alone(models, transcoders_dir):
    yield from serving(models[1], ENC, transcoders=str(transcoders_dir))


NO_TRANSCODERS = "the server has no transcoders: start it with gpt2 serve --transcoders DIR"
NO_DATA = "the server has no feature data to find a feature's contexts in: start it with gpt2 serve --feature-data DIR"


def test_without_transcoders_or_feature_data_the_routes_say_how_to_start_the_server(server, transcoders_alone):
    for route, body in (("graph", {"prompt": "Hello"}), ("feature", {"layer": 0, "feature": 0})):
        response = post(server, body, f"/v1/circuits/{route}")  # the serve tests' server: no transcoders
        assert response.status_code == 400 and NO_TRANSCODERS in response.json()["error"]["message"], route
    response = post(transcoders_alone, {"layer": 0, "feature": 0}, "/v1/circuits/feature")
    assert response.status_code == 400 and NO_DATA in response.json()["error"]["message"]
    assert post(transcoders_alone, {"prompt": "Hello"}, "/v1/circuits/graph").status_code == 200


BAD_GRAPHS = [
    (
        "graph",
        {"prompt": [15496] * MOST},
        "prompt",
        f"the prompt is {MOST + 1} tokens with <|endoftext|> put first, over this server's limit of {MOST} for an "
        "attribution graph (max_graph_tokens): give a shorter prompt",
    ),
    (
        "graph",
        {"prompt": "Hello", "node_threshold": 1.5},
        "node_threshold",
        "node_threshold must be a number from 0 to 1",
    ),
    ("graph", {"prompt": "Hello", "edge_threshold": "all"}, "edge_threshold", "(a share of the influence), got 'all'"),
    ("graph", {"prompt": "Hello", "max_feature_nodes": 0}, "max_feature_nodes", "must be a positive integer or null"),
    ("graph", {"prompt": [50257]}, "prompt", "token id 50257 in prompt is out of range"),
    ("graph", {"prompt": ""}, "prompt", "the prompt is 1 token: an attribution graph leaves its first position out"),
    ("graph", {"prompt": [50256]}, "prompt", "the prompt is 1 token: an attribution graph leaves its first"),
    ("graph", {"prompt": "Hello", "slug": "x"}, "slug", "Unrecognized request argument supplied: slug"),
    ("feature", {"layer": 2, "feature": 0}, "layer", "layer must be an integer from 0 to 1, got 2"),
    ("feature", {"layer": 0, "feature": 48}, "feature", "feature must be a feature's index (an integer) from 0 to 47"),
    ("feature", {"layer": 0, "feature": -1}, "feature", "feature must be a feature's index, an integer from 0 up"),
    ("feature", {"layer": 0, "feature": 1, "top_k": 101}, "top_k", "top_k must be an integer from 1 to 100, got 101"),
    ("feature", {"feature": 1}, "layer", "layer must be an integer"),
]


@pytest.mark.parametrize(
    "route, body, param, message", BAD_GRAPHS, ids=[f"{b[0]}-{b[2]}{i}" for i, b in enumerate(BAD_GRAPHS)]
)
def test_a_bad_graph_or_feature_request_gets_a_400_naming_the_field(graph_server, route, body, param, message):
    response = post(graph_server, body, f"/v1/circuits/{route}")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"], error


def test_a_graph_prompt_of_max_graph_tokens_is_drawn_and_the_default_limit_is_64(graph_server):
    assert Limits().max_graph_tokens == 64
    assert post(graph_server, {"prompt": [15496] * (MOST - 1)}, "/v1/circuits/graph").status_code == 200
    with pytest.raises(InvalidArgumentError, match="max_graph_tokens must be a positive integer, got 0"):
        Limits(max_graph_tokens=0)


def test_transcoders_of_another_model_fail_the_load_and_say_why(models, tmp_path):
    wrong = random_transcoders(tmp_path / "wide", n_embd=32)
    server = create_app(lambda: (models[1], ENC), "tiny", transcoders=wrong, load_in_background=False).state.server
    with pytest.raises(InvalidArgumentError, match="reads d_model=32 and writes 32, but the model's n_embd=48"):
        server.load_model()


def test_gpt2_serve_takes_the_transcoders_the_feature_data_and_the_graph_limit(
    models, transcoders_dir, feature_data, forks
):
    process, url = gpt2_serve(
        forks,
        "--model",
        models[2],
        "--transcoders",
        str(transcoders_dir),
        "--feature-data",
        str(feature_data),
        "--max-graph-tokens",
        "6",
    )
    try:
        answer = httpx.post(url + "/v1/circuits/feature", json={"layer": 0, "feature": 3}, timeout=HANG).json()
        expected = top_contexts(models[1], load_transcoders(transcoders_dir), read_windows(feature_data, 64, 64), 0, 3)
        assert [(c["row"], c["position"], c["ids"]) for c in answer["contexts"]] == [
            (c["row"], c["position"], c["ids"]) for c in expected
        ]  # the model read from its directory: the same weights, its numbers to within float32's rounding
        for got, want in zip(answer["contexts"], expected):
            assert got["activations"] == pytest.approx(want["activations"], abs=1e-5)
        refused = httpx.post(url + "/v1/circuits/graph", json={"prompt": [15496] * 6}, timeout=HANG).json()
        assert "the prompt is 7 tokens with <|endoftext|> put first, over this server's limit of 6" in str(refused)
    finally:
        process.kill()


@pytest.fixture(scope="module")
def trained_here(models, feature_data, tmp_path_factory):
    """Transcoders gpt2 train-sae's library trained on the feature data, saved with its training.json."""
    from gpt2.inspect.dictionaries import DictionaryConfig
    from gpt2.inspect.dictionary_training import TrainingSettings, train_dictionaries, transcoder_sites

    settings = TrainingSettings(steps=2, batch_size=64, context=32, windows=4, eval_interval=2, eval_windows=2)
    run = train_dictionaries(models[1], feature_data, transcoder_sites(2), DictionaryConfig(d_dict=64), settings)
    return run.save(tmp_path_factory.mktemp("trained") / "tc")


def test_transcoders_trained_here_find_contexts_in_their_training_data(models, trained_here, feature_data):
    tcs = load_transcoders(trained_here / "circuit-tracer")
    windows = read_windows(feature_data, 64, 64)
    for running in serving(models[1], ENC, transcoders=str(trained_here / "circuit-tracer")):  # no --feature-data
        answer = post(running, {"layer": 1, "feature": 3, "top_k": 4}, "/v1/circuits/feature").json()
        assert answer["contexts"] == top_contexts(models[1], tcs, windows, 1, 3, k=4) and len(answer["contexts"]) == 4
