"""The page's exemplar bookkeeping (``static/exemplars.js``) and how it reads a lost exemplar
from a refusal (``kserve.js``'s ``exemplarGone``), under Node without a browser or a server.

The Chromium test (tests/integration/test_sam3_concept_web.py) drives the same module against
the served concept model; this one pins what each request sends as boxes and ids change.
"""

from __future__ import annotations

import json

import pytest
from test_web_modules import NODE, module, run_node

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (the browser test covers it)")

# Stand-ins for the three elements the module touches, and for the tab's sessionStorage
# kserve.js reads a token from when it loads.
STAND_INS = """
globalThis.sessionStorage = { getItem: () => null, setItem() {}, removeItem() {} };
const form = { hidden: false };
const ui = {
  mode: { value: "1", closest: () => form },
  status: { textContent: "" },
  clear: { hidden: true, addEventListener(_, f) { this.click = f; } },
};
"""


def test_boxes_go_once_then_their_id_on_every_image_until_cleared():
    script = f"""
{STAND_INS}
const {{ Exemplars }} = await import({json.dumps(module("exemplars.js"))});
let changes = 0;
const ex = new Exemplars(ui, () => changes++);
const a = {{ name: "a" }}, b = {{ name: "b" }}, large = {{ large: {{}} }};
const out = {{}};
out.draws = [ex.drawsOn(a), ex.drawsOn(large), ex.drawsOn(null)];
ex.add([1, 2, 30, 40], a);
ui.mode.value = "0";
ex.add([5, 6, 7, 8], a);
out.first = ex.request(a);
out.status1 = ui.status.textContent;
out.onB = ex.request(b);               // boxes drawn on a never go with b
ex.keep("abcdefghijkl", out.first, a);
out.afterKeep = ex.request(a);
out.status2 = ui.status.textContent;
ex.add([0, 0, 9, 9], a);
ex.imageChanged(b);                    // a's unsent box goes with a
out.next = ex.request(b);
out.anyB = ex.any(b);
ex.keep(null, out.next, b);            // ids alone: the answer has no new id
ex.keep("second", {{ boxes: [[1, 1, 2, 2]], labels: [1] }}, b);
ex.forget(0);                          // the server lost the first
out.afterForget = ex.request(b);
ui.clear.click();
out.cleared = [ex.request(b), ex.any(b), ui.status.textContent, ui.clear.hidden];
ui.mode.value = "";
out.off = ex.drawsOn(a);
form.hidden = true; ui.mode.value = "1";
out.hiddenForm = ex.drawsOn(a);
out.changes = changes;
console.log(JSON.stringify(out));
"""
    out = json.loads(run_node(script))
    assert out["draws"] == [True, False, False]
    assert out["first"] == {"boxes": [[1, 2, 30, 40], [5, 6, 7, 8]], "labels": [1, 0], "ids": []}
    assert out["status1"] == "Exemplars: 2 boxes to send (1 more, 1 less)"
    assert out["onB"] == {"boxes": [], "labels": [], "ids": []}
    assert out["afterKeep"] == {"boxes": [], "labels": [], "ids": ["abcdefghijkl"]}
    assert out["status2"] == "Exemplars: in use: exemplar abcdefgh… (1 more, 1 less)"
    assert out["next"] == {"boxes": [], "labels": [], "ids": ["abcdefghijkl"]}
    assert out["anyB"] is True
    assert out["afterForget"] == {"boxes": [], "labels": [], "ids": ["second"]}
    assert out["cleared"] == [{"boxes": [], "labels": [], "ids": []}, False, "", True]
    assert out["off"] is False and out["hiddenForm"] is False
    # Each redraws: 3 adds, imageChanged, 2 keeps (not the one without an id), forget, clear.
    assert out["changes"] == 8


def test_a_lost_exemplar_is_read_from_the_refusal_not_any_miss():
    script = f"""
{STAND_INS}
const {{ ServerError, exemplarGone }} = await import({json.dumps(module("kserve.js"))});
const cases = [
  new ServerError(404, "ExemplarNotFound", "exemplar_ids[1]: 'x' is not held on this server"),
  new ServerError(404, "EmbeddingNotFound", "exemplar_ids[0]: 'x' is not held on this server"),
  new ServerError(404, "EmbeddingNotFound", "image_id: 'abc' is not held"),
  new ServerError(400, "InvalidInput", "exemplar_ids[2]: too long"),
  new Error("exemplar_ids[0]"),
];
console.log(JSON.stringify(cases.map(exemplarGone)));
"""
    assert json.loads(run_node(script)) == [1, 0, None, None, None]
