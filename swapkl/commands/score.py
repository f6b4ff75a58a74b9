"""``python -m swapkl score MODEL ...``: both swap-KL matrices, cached, optionally written as JSON."""
from __future__ import annotations

from swapkl.commands.common import (ProgressPrinter, add_contract_args, add_model_args, check_outputs,
                                    contract_from_args, emit, load_from_args)


def register(sub) -> None:
    p = sub.add_parser("score", help="compute replacement and interchange swap-KL (both protocols)")
    add_model_args(p)
    add_contract_args(p)
    p.add_argument("--json", default=None, metavar="OUT", help="write the result JSON here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(a) -> int:
    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI's --help must not

    contract = contract_from_args(a)  # validates --pairs etc. before any loading
    check_outputs(a, {"--json": a.json})  # a bad --json fails now, not after the computation
    ck = load_from_args(a)
    res = score(ck, contract, progress=ProgressPrinter(a.quiet), use_cache=not a.no_cache)
    return emit(a, res, render_summary)


def render_summary(res) -> str:
    s = res.summary(ci=False)
    c = res.contract
    lines = [f"model: {res.identity.get('display') or res.identity.get('id')}  layers: {res.num_layers}",
             f"contract: unit={c.get('unit', 'block')} per-layer={c.get('per_layer', 'slot')} pairs={c['pairs']} prompts={c['prompts']}x{c['tokens']} positions={c['positions']} "
             f"dtype={c['dtype']} aggregation={c['aggregation']} corpus={c.get('corpus_label')}",
             f"pairs computed: {res.meta.get('computed_pairs')}, from cache: {res.meta.get('cached_pairs')}, "
             f"noise floor {res.noise_floor if res.noise_floor is not None else float('nan'):.2e} nats"]
    if res.undefined:
        (i, j), why = next(iter(sorted(res.undefined.items())))
        lines.append(f"n/a: {len(res.undefined)} pair(s) undefined under per-layer={c.get('per_layer', 'slot')}, "
                     f"e.g. ({i}, {j}): {why}")
    if s.get("pairs"):
        lines += [f"gap d_repl - d_inter (nats): mean {s['gap']['mean']:.4f} median {s['gap']['median']:.4f} "
                  f"p75 {s['gap']['p75']:.4f} max {s['gap']['max']:.4f}; KL ratio median {s['kl_ratio']['median']:.3f}",
                  f"best replacement pair {tuple(s['replacement']['best_pair'])} {s['replacement']['best']:.4f}; "
                  f"best interchange pair {tuple(s['interchange']['best_pair'])} {s['interchange']['best']:.4f}",
                  f"pairs < 0.05 / < 0.10 nats: replacement {s['replacement']['strong']}/{s['replacement']['conditional']}, "
                  f"interchange {s['interchange']['strong']}/{s['interchange']['conditional']}"]
    return "\n".join(lines)
