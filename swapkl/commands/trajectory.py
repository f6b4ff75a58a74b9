"""``python -m swapkl trajectory CHECKPOINTS...`` and ``python -m swapkl demo-trajectory``.

``trajectory`` scores each checkpoint (both protocols, each cached on its own) and prints, per checkpoint,
the gap distribution d_repl - d_inter (nats), the KL ratio d_inter / d_repl and the Pearson correlation of
the two protocols over the pairs, then the last checkpoint's gap against normalised depth.
``demo-trajectory`` trains a small GPT-NeoX on the CPU and saves a checkpoint trajectory to try it on.
"""
from __future__ import annotations

import sys
import time

from swapkl.commands.common import ProgressPrinter, add_contract_args, check_outputs, contract_from_args, emit
from swapkl.trajectory import demo as demo_trajectory
from swapkl.trajectory.demo import DemoSettings, read_manifest
from swapkl.surgery.outputs import check_output_dir
from swapkl.trajectory.checkpoints import parse_checkpoints
from swapkl.trajectory.compute import compute_trajectory
# Deferred imports: pandas is imported by render() only: the CLI's --help must not load it.


def register(sub) -> None:
    p = sub.add_parser(
        "trajectory", help="gap between the two protocols over training checkpoints",
        description="Score every checkpoint (both protocols, cached per checkpoint) and summarise how the "
                    "replacement/interchange gap evolves.  CHECKPOINTS: 'org/model@step0 @step1000 ...', "
                    "'org/model step0 step1000', local folders (a folder of step*/checkpoint-* subfolders or a "
                    "demo-trajectory output expands to its checkpoints, sorted by step), .gguf files, 'default'.")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINTS", help="checkpoint list (see above)")
    add_contract_args(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--json", default=None, metavar="OUT", help="write the trajectory (statistics and every "
                                                               "checkpoint's result) as JSON here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run_trajectory)

    d = sub.add_parser(
        "demo-trajectory", help="train a small GPT-NeoX on the CPU and save a checkpoint trajectory",
        description="Train a small Pythia-style GPT-NeoX on the built-in corpus and save Hugging Face "
                    "checkpoints at step 0 (initialisation) and geometrically spaced later steps, with a "
                    "trajectory.json manifest.  Then: python -m swapkl trajectory OUT")

    dflt = DemoSettings()
    d.add_argument("--out", default=None, metavar="DIR", help="output folder (default: cache/demo-trajectory)")
    d.add_argument("--steps", type=int, default=dflt.steps, help=f"most training updates (default {dflt.steps})")
    d.add_argument("--seconds", type=float, default=dflt.seconds,
                   help=f"time budget in seconds for the whole run (default {dflt.seconds:g})")
    d.add_argument("--checkpoints", type=int, default=dflt.checkpoints,
                   help=f"checkpoints including step 0 (default {dflt.checkpoints})")
    d.add_argument("--seed", type=int, default=dflt.seed)
    d.add_argument("--layers", type=int, default=dflt.layers)
    d.add_argument("--hidden", type=int, default=dflt.hidden)
    d.add_argument("--heads", type=int, default=dflt.heads)
    d.add_argument("--vocab", type=int, default=dflt.vocab, help="BPE vocabulary size (>= 257)")
    d.add_argument("--threads", type=int, default=dflt.threads, help="torch CPU threads (0 = torch default)")
    d.add_argument("--force", action="store_true", help="retrain even if OUT holds the same trajectory")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=run_demo)


def _fmt(v, nd=4) -> str:
    try:
        if v is None or v != v:
            return "nan"
    except TypeError:
        return str(v)
    return f"{v:.{nd}f}"


def render(traj) -> str:
    """The text report of a :class:`swapkl.trajectory.compute.Trajectory`."""
    import pandas as pd

    df = traj.summary()
    c = traj.results[0].contract if traj.results else traj.contract
    lines = [f"contract: pairs={c.get('pairs')} prompts={c.get('prompts')}x{c.get('tokens')} "
             f"positions={c.get('positions')} dtype={c.get('dtype')} aggregation={c.get('aggregation')} "
             f"corpus={c.get('corpus_label', c.get('corpus'))}",
             "gap g = d_repl - d_inter (nats) per checkpoint; ratio = d_inter / d_repl; r = Pearson(d_repl, d_inter)",
             f"{'step':>8}  {'pairs':>5}  {'g mean':>8}  {'g median':>8}  {'g p75':>8}  {'g max':>8}  "
             f"{'ratio mean':>10}  {'ratio med':>9}  {'r':>6}  checkpoint"]
    for row in df.itertuples():
        step = "?" if pd.isna(row.step) else str(row.step)
        lines.append(f"{step:>8}  {row.pairs:>5}  {_fmt(row.gap_mean):>8}  {_fmt(row.gap_median):>8}  "
                     f"{_fmt(row.gap_p75):>8}  {_fmt(row.gap_max):>8}  {_fmt(row.ratio_mean, 3):>10}  "
                     f"{_fmt(row.ratio_median, 3):>9}  {_fmt(row.pearson, 3):>6}  {row.label}")
    if traj.results:
        dep = traj.depth()
        lines.append(f"last checkpoint ({df.iloc[-1]['label']}): gap vs normalised depth (i+j)/2/(L-1)")
        lines.append(f"{'pair':>9}  {'depth':>6}  {'d_repl':>8}  {'d_inter':>8}  {'gap':>8}")
        for r in dep.itertuples():
            lines.append(f"{f'{r.i}-{r.j}':>9}  {r.depth:6.3f}  {_fmt(r.d_repl):>8}  {_fmt(r.d_inter):>8}  "
                         f"{_fmt(r.gap):>8}")
    return "\n".join(lines)


def run_trajectory(a) -> int:
    contract = contract_from_args(a)  # validates --pairs etc. before any loading
    specs = parse_checkpoints(a.checkpoints)
    check_outputs(a, {"--json": a.json}, inputs=[s.spec for s in specs])
    if not a.quiet:
        print(f"{len(specs)} checkpoints: " + ", ".join(s.display() for s in specs), file=sys.stderr)
    traj = compute_trajectory(specs, contract, progress=ProgressPrinter(a.quiet), use_cache=not a.no_cache)
    return emit(a, traj, render)


def run_demo(a) -> int:
    s = DemoSettings(steps=a.steps, seconds=a.seconds, checkpoints=a.checkpoints, seed=a.seed, layers=a.layers,
                     hidden=a.hidden, heads=a.heads, vocab=a.vocab, threads=a.threads)
    t0 = time.perf_counter()

    def progress(step, total, msg):
        if not a.quiet:
            print(f"  [{time.perf_counter() - t0:6.1f}s] step {step}/{total}: {msg}", file=sys.stderr, flush=True)

    if a.out:  # the library decides whether a folder's content may be replaced; a file in the way fails now
        check_output_dir(a.out, "--out", force=True)
    out = demo_trajectory.train_demo_trajectory(a.out, settings=s, force=a.force, progress=progress)
    m = read_manifest(out) or {}
    if not a.quiet:
        print(f"demo trajectory in {out}: {m.get('parameters')} parameters, {m.get('num_layers')} layers, "
              f"final step {m.get('final_step')} of {m.get('settings', {}).get('steps')} requested"
              + (" (stopped at the time limit)" if m.get("stopped_early") else ""))
        for c in m.get("checkpoints", []):
            print(f"  {c['folder']:>10}  held-out loss {c['heldout_loss']:.3f} nats/token")
        print(f"next: python -m swapkl trajectory {out}")
    return 0
