"""A run's probes (gpt2.training.probes): what the model does with the probe at each evaluation,
equal to transformers' attention, head scores written out by hand, its logits and its greedy
generation; probes.jsonl across a resume; TensorBoard's images and text of them; bad probes."""

from __future__ import annotations

import io

import pytest
import torch
from helpers import head_score_written_out, hf_and_ours

from gpt2 import InvalidArgumentError
from gpt2.data.synthetic import prepare_synthetic
from gpt2.inspect.circuits import HEAD_SCORES
from gpt2.settings import TrainSettings
from gpt2.tokenizer import Tokenizer
from gpt2.training.loggers import read_log
from gpt2.training.probes import probe_ids, probe_record
from gpt2.training.train import train

pytestmark = pytest.mark.filterwarnings("ignore::gpt2.training.optim.WarmupWarning")

TINY = dict(
    n_layer=1, n_head=2, n_embd=16, block_size=32, batch_size=2, eval_interval=2, eval_iters=1, device="cpu",
    progress=False,
)  # fmt: skip


def test_a_probe_record_equals_transformers_attention_scores_logits_and_greedy_generation(tmp_path):
    hf, ours = hf_and_ours(tmp_path, seed=4, vocab_size=50257, n_positions=48, n_embd=48, n_layer=2, n_head=3)
    hf.config._attn_implementation = "eager"
    tokenizer = Tokenizer.gpt2()
    ids = tokenizer.encode("The cat sat on the mat. The cat sat on the")
    record = probe_record(ours, tokenizer, ids, 7)
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True)
        greedy = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0, len(ids) :]
    attention = torch.cat(out.attentions)  # (L, H, T, T)
    assert record["iter"] == 7 and record["ids"] == ids and record["tokens"] == [tokenizer.decode([i]) for i in ids]
    torch.testing.assert_close(torch.tensor(record["attention"]), attention, atol=6e-5, rtol=0)
    for kind in HEAD_SCORES:
        expected = [[head_score_written_out(attention[l, h], ids, kind) for h in range(3)] for l in range(2)]
        torch.testing.assert_close(torch.tensor(record["head_scores"][kind]), torch.tensor(expected), atol=1e-5, rtol=0)
    last = record["logit_lens"][-1]  # the output row: the model's own next-token choice at each position
    assert [e["id"] for e in last] == out.logits[0].argmax(-1).tolist()
    assert record["sample_ids"] == greedy.tolist() and record["sample"] == tokenizer.decode(greedy.tolist())


def test_probes_are_recorded_at_each_interval_and_a_resume_records_the_rest_once(char_data, tmp_path):
    out, board = tmp_path / "out", tmp_path / "board"
    train(out, data=char_data, max_iters=4, probe="ROMEO:", probe_interval=1, tensorboard=board, **TINY)
    records = read_log(out / "probes.jsonl")
    assert [r["iter"] for r in records] == [0, 1, 2, 3, 4]
    assert all(r["tokens"] == list("ROMEO:") and len(r["sample_ids"]) == 16 for r in records)
    train(out, resume=True, max_iters=6, progress=False)  # from the checkpoint of iteration 4: probes 4 again, once
    assert [r["iter"] for r in read_log(out / "probes.jsonl")] == [0, 1, 2, 3, 4, 5, 6]
    import matplotlib.image

    assert matplotlib.image.imread(out / "heads.png").shape[1] > 500  # each head's scores against iterations

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(board), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    for kind in HEAD_SCORES:
        images = {e.step: e for e in events.Images(f"probe/{kind}")}
        assert sorted(images) == [0, 1, 2, 3, 4, 5, 6]
        picture = Image.open(io.BytesIO(images[6].encoded_image_string))
        assert picture.size == (2 * 24, 1 * 24)  # a cell a head: 2 heads across, 1 layer down
        score = read_log(out / "probes.jsonl")[-1]["head_scores"][kind][0][1]  # layer 0, head 1: the right cell
        blue = picture.getpixel((36, 12))[2]
        assert abs(blue - round(255 - (255 - 107) * min(max(score, 0), 1))) <= 1
    samples = {e.step for e in events.Tensors("probe/sample/text_summary")}
    assert samples == {0, 1, 2, 3, 4, 5, 6}


def test_an_induction_run_probes_its_repeated_random_tokens_by_default(tmp_path):
    data = tmp_path / "data"
    prepare_synthetic(data, "induction", rows=400, progress=False)
    train(tmp_path / "out", data=data, max_iters=2, **{**TINY, "block_size": 64})
    records = read_log(tmp_path / "out" / "probes.jsonl")
    ids = records[0]["ids"]
    assert [r["iter"] for r in records] == [0, 2] and len(ids) == 32 and ids[:16] == ids[16:]  # probe_repeat's 16
    assert records[0]["tokens"] is None and records[0]["sample"] is None


def test_a_probe_the_run_cannot_read_is_refused_before_it_starts(tmp_path, char_data):
    induction = tmp_path / "data"
    prepare_synthetic(induction, "induction", rows=100, progress=False)
    with pytest.raises(InvalidArgumentError, match="probe: this run's data has no tokenizer") as e:
        train(tmp_path / "a", data=induction, max_iters=2, probe="hello", **{**TINY, "block_size": 64})
    assert e.value.param == "probe"
    with pytest.raises(InvalidArgumentError, match="probe must be 1 to 32 tokens") as e:
        train(tmp_path / "b", data=char_data, max_iters=2, probe="x" * 33, **TINY)
    with pytest.raises(InvalidArgumentError, match="probe 'abc' has no token that repeats") as e:
        train(tmp_path / "c", data=char_data, max_iters=2, probe="abc", **TINY)
    assert e.value.param == "probe" and not (tmp_path / "c" / "log.jsonl").exists()
    with pytest.raises(InvalidArgumentError, match="probe_repeat must be"):
        TrainSettings(data=str(char_data), probe_repeat=-1)
    settings = TrainSettings(data=str(char_data), probe_repeat=0)
    assert probe_ids(settings, None, None) is None  # no probes
