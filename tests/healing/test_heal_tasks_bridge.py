"""Task accuracy after a heal that starts from a linear bridge (``swapkl heal --repair bridge --tasks``,
swapkl.healing.tasks): per set the raw cut, the bridged model and the healed model are evaluated; the bridged and
healed models the runner builds are the ones the heal measured perplexity on (logits, PPL), for ``--train lora`` and
``--train bridge``; their metrics equal a plain ``lm_eval.simple_evaluate`` on an HFLM around the model built by hand;
their cache keys carry the bridge (no entry shared with the raw cut or a heal without a bridge); and the CLI's JSON
carries the three rows (kd/bridge: the control is the base).  stories260K, the fixture task, 4 documents."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swapkl.healing.curves import HealCurves
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.measure.task_runner import TaskSettings
from support.cli_run import run_swapkl
from support.tensors import logits

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "tasks"
TASK = "tinystories_mc"
LIMIT = 4
EV = Evaluator("tiny", 300, 128, 64)
BRIDGE = {"calib_tokens": 512, "calib_window": 64}
REMOVED = [2]


def _recipe(part):
    return Recipe(steps=3, rank=2, seq_len=32, batch=2, lr=1e-2, warmup=1, checkpoint_every=2, part=part)


@pytest.fixture(scope="module", params=["lora", "bridge"])
def run(request, tasks_env, stories, small_corpus):
    """One heal after a bridge (``--train`` as the param) and its tasks block, in one session."""
    from swapkl.healing.heal import HealSetup, heal
    from swapkl.healing.tasks import heal_task_accuracy

    recipe, shared, states = _recipe(request.param), {}, {}
    setup = HealSetup(corpus=small_corpus, evaluator=EV, identity=stories.identity)
    res = heal(stories.model, stories.tokenizer, REMOVED, recipe, setup, plan=RemovalPlan(1, repair="bridge", bridge=BRIDGE),
               keep_states=states, shared=shared)
    hc = HealCurves.from_heals([("given", 1, res)])
    settings = TaskSettings((TASK,), include_path=str(FIXTURE_TASKS), limit=LIMIT)
    ht = heal_task_accuracy(stories.model, stories.tokenizer, hc, settings, recipe, adapters=shared["adapters"],
                            bridges=shared["bridges"], hooks=RunHooks(identity=stories.identity))
    return recipe, res, states, shared, hc, ht


def _close(a, b):
    assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()


def _plain_lm_eval(model, tokenizer) -> dict:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=16)
    return lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(FIXTURE_TASKS)),
                                   limit=LIMIT, log_samples=False, verbosity="ERROR")["results"][TASK]


def test_rows_and_contract(run):
    recipe, res, _, _, _, ht = run
    (e,) = ht["methods"]["given"]
    assert e["removed"] == REMOVED and set(e) == {"n", "removed", "pruned", "bridged", "healed"}
    for role in ("pruned", "bridged", "healed"):
        assert set(e[role]["metrics"][TASK]) == {"acc,none", "acc_norm,none"}
    c = ht["contract"]
    assert c["repair"]["settings"] == res.contract["repair"]["settings"] and "raw cut" in c["pruned_model"]
    assert "bridge" in c["evaluator"] and c["recipe_key"] == recipe.key()
    # base, control, raw cut, bridged, healed: five models, each evaluated once (a fresh key for each)
    assert ht["stats"]["evaluations"] + ht["stats"]["cache_hits"] == 5
    from swapkl.healing.task_figures import heal_tasks_table

    table = heal_tasks_table(ht)
    for col, role in ((" before healing", "pruned"), (" bridged", "bridged"), (" healed", "healed")):
        assert table[f"{TASK} acc,none{col}"].iloc[2] == e[role]["metrics"][TASK]["acc,none"]


def test_bridged_and_healed_are_the_heals_models_and_equal_plain_lm_eval(run, stories, small_corpus):
    """The runner's bridged and healed models have the logits of the models the heal measured (bridged_model of the
    session's fit; healed_model of the kept state with the bridges), the PPL the heal reported, and lm-eval's own
    simple_evaluate on them gives the JSON's metrics."""
    from swapkl.healing import train as TR
    from swapkl.healing.tasks import _HealRunner, bridged_tag, heal_tag
    from swapkl.measure import evaluate as E
    from swapkl.repair.bridge import bridged_model

    recipe, res, states, shared, hc, ht = run
    (e,) = ht["methods"]["given"]
    hb = shared["bridges"][tuple(REMOVED)]
    key = ",".join(map(str, REMOVED))
    runner = _HealRunner(stories.model, stories.tokenizer, [], None, identity=None,
                         settings=TaskSettings((), limit=LIMIT, num_fewshot=None, batch_size=16, use_cache=False),
                         hooks=RunHooks(), total=1, states={key: dict(states["healed"])}, recipe=recipe,
                         bridges={key: hb})
    by_hand = {"bridged": bridged_model(stories.model, list(hb.bridges)),
               "healed": TR.healed_model(stories.model, REMOVED, recipe, states["healed"], bridges=hb.bridges)}
    built = {"bridged": runner._build(REMOVED, bridged_tag(hc, hb)), "healed": runner._build(REMOVED, heal_tag(hc, hb))}
    x = torch.randint(1, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    ids = E.eval_ids(small_corpus, stories.tokenizer, EV)
    rows = res.repair["eval"]["rows"]
    for role in ("bridged", "healed"):
        _close(logits(built[role], x), logits(by_hand[role], x))
        ppl = E.evaluate_ppl(built[role], ids, EV.window, EV.stride, EV.drop_first_target).ppl
        assert ppl == pytest.approx(rows[role]["ppl"], rel=1e-6)
        plain = _plain_lm_eval(by_hand[role], stories.tokenizer)
        for m in ("acc", "acc_norm"):
            assert e[role]["metrics"][TASK][f"{m},none"] == plain[f"{m},none"]
            assert e[role]["stderr"][TASK][f"{m},none"] == plain[f"{m}_stderr,none"]
    assert rows["healed"]["ppl"] == res.ppl["healed"]
    # the training changed the model (the check above could not pass by evaluating the bridged model twice)
    assert not torch.allclose(logits(by_hand["healed"], x), logits(by_hand["bridged"], x))
    if recipe.part == "bridge":  # the trained W moved from its least-squares fit (the healed model carries it)
        (w,) = [v for k, v in states["healed"].items() if k.endswith("swapkl_bridge.W")]
        assert not torch.allclose(w.double(), torch.as_tensor(hb.bridges[0].W))


def test_cache_keys_carry_the_bridge(run, stories):
    """The bridged and healed entries are keyed apart from the raw cut (the ``swapkl tasks`` key) and from a heal
    of the same set without a bridge; a second call reads all five from the cache."""
    from swapkl.healing.tasks import _HealRunner, bridged_tag, heal_tag, heal_task_accuracy
    from swapkl.measure import lmeval

    recipe, _, _, shared, hc, ht = run
    hb = shared["bridges"][tuple(REMOVED)]
    _, [task] = lmeval.load_tasks(lmeval.check_include_path(FIXTURE_TASKS), [TASK])
    r = _HealRunner(None, None, [task], None, identity=stories.identity,
                    settings=TaskSettings((), limit=LIMIT, num_fewshot=None, batch_size=16), hooks=RunHooks(), total=1,
                    states={}, recipe=recipe)
    paths = [r._path(REMOVED, tag, task) for tag in (None, bridged_tag(hc, hb), heal_tag(hc, hb), heal_tag(hc))]
    assert len(set(paths)) == 4
    (e,) = ht["methods"]["given"]
    assert r._read(paths[0])["metrics"] == e["pruned"]["metrics"]
    assert r._read(paths[1])["metrics"] == e["bridged"]["metrics"]
    assert r._read(paths[2])["metrics"] == e["healed"]["metrics"]
    assert r._read(paths[3]) is None
    settings = TaskSettings((TASK,), include_path=str(FIXTURE_TASKS), limit=LIMIT)
    again = heal_task_accuracy(stories.model, stories.tokenizer, hc, settings, recipe, bridges=shared["bridges"],
                               hooks=RunHooks(identity=stories.identity))  # adapters from the heal cache
    assert again["stats"]["evaluations"] == 0 and again["methods"] == ht["methods"]


def test_missing_bridges_are_refused(run, stories):
    from swapkl.errors import SwapklError
    from swapkl.healing.tasks import heal_task_accuracy

    recipe, _, _, shared, hc, _ = run
    settings = TaskSettings((TASK,), include_path=str(FIXTURE_TASKS), limit=LIMIT)
    with pytest.raises(SwapklError, match="bridges of removed \\[2\\] are not in this session"):
        heal_task_accuracy(stories.model, stories.tokenizer, hc, settings, recipe, adapters=shared["adapters"])


def test_cli_kd_bridge_with_tasks(tasks_env, stories_path, small_corpus, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text(" ".join(small_corpus.words))
    js = tmp_path / "h.json"
    r = run_swapkl("heal", stories_path, "--removed", "2", "--steps", "2", "--seq-len", "32", "--batch", "2",
                   "--eval-text", text, "--max-words", "300", "--repair", "bridge", "--train", "bridge",
                   "--objective", "kd", "--calib-tokens", "512", "--calib-window", "64",
                   "--tasks", TASK, "--include-path", FIXTURE_TASKS, "--limit", "4", "--json", js)
    assert r.returncode == 0, r.stderr
    d = json.loads(js.read_text())
    t = d["tasks"]
    (e,) = t["methods"]["given"]
    assert e["removed"] == [2] and {"pruned", "bridged", "healed"} <= set(e)
    assert t["base_finetuned"] == t["base"]  # the kd control is the base itself
    assert t["contract"]["repair"]["settings"] == d["repair"]["settings"] and t["contract"]["limit"] == 4
    acc = e["bridged"]["metrics"][TASK]["acc_norm,none"]
    assert f", bridged {acc:.4f}" in r.stdout
