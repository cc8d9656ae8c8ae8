"""The attribution-graph demonstration (scripts/induction_graph.py, docs/inspect.md "An attribution graph of
induction"), run as documented but with fewer training steps: its commands succeed, the graph's files and
picture are written, the strongest edge into the predicted logit comes from the earlier copy's next token (the
path through the induction head), and setting the features on the path lowers that logit, as the graph says."""

from __future__ import annotations

import json
import runpy
import sys

from helpers import REPO


def test_the_induction_graph_demonstration(tmp_path, monkeypatch, capsys):
    script = REPO / "scripts" / "induction_graph.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--work", str(tmp_path / "work"), "--steps", "300"])
    module = runpy.run_path(str(script))
    assert module["main"]() == 0
    out = capsys.readouterr().out
    found = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    ids = module["prompt"]()
    assert found["token"] == ids[6]  # the token after the earlier copy of the last one: induction
    assert found["strongest_input"] == {"kind": "token", "position": 6, "id": ids[6]}
    assert found["predicted"] < 0 and found["actual"] < 0  # set to -2x, the features lower the logit they raise
    assert found["top"][0]["after"] < found["top"][0]["before"]
    graphs = tmp_path / "work" / "graphs"
    data = json.loads((graphs / "induction.json").read_text())
    assert {"source": f"E_{ids[6]}_6", "target": f"3_{ids[6]}_15"} in [
        {k: link[k] for k in ("source", "target")} for link in data["links"]
    ]
    assert (graphs / "induction.png").stat().st_size > 10_000
    assert json.loads((graphs / "graph-metadata.json").read_text())["graphs"][0]["slug"] == "induction"
