"""Published-runs benchmark: sapptk's estimated step time and peak memory against the measured
training runs in ``data/published/runs.yaml`` (paper tables and frameworks' performance pages,
each row with its source), before any fit (the bundled hardware cards) and after
:func:`sapptk.models.hardware_fit.fit_hardware` fitted each GPU's card on the rows marked
``split: fit``. The rows marked ``predict`` never set a parameter: their figures are the test.

Printed: every row (measured and predicted tokens/s per GPU, step-time error, peak-memory error
and which figure was measured), then per split the step-time error (median and max of |err|),
the ratios between variants of one stack (throughput ratio predicted / measured − 1), the
peak-memory error, and whether the layouts of one MoE model come out in the measured order.
``--markdown`` prints the summary tables as docs/benchmarks.md holds them.

Run: ``.venv/bin/python benchmarks/published.py [--markdown] [--rows]``

A GPU with the source's own overrides (torchtitan's Grand Teton H100s: 96 GB HBM2e at 2.4 TB/s,
500 W) is a card of its own: it is fitted on its own fit rows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sapptk.models import hardware
from sapptk.models.hardware_fit import fit_hardware, predict_rows
from sapptk.models.measured import MeasuredRow, load_measured_rows

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "published" / "runs.yaml"
TARGETS = {"step_median": 0.10, "step_max": 0.25, "ratio_max": 0.05, "memory_median": 0.10, "memory_max": 0.20}


def card_key(row: MeasuredRow) -> str:
    """The card a row runs on: its GPU, with the source's overrides if any."""
    if not row.hardware_overrides:
        return row.gpu
    return row.gpu + "[" + ", ".join(f"{k}={v}" for k, v in sorted(row.hardware_overrides.items())) + "]"


def predict(rows: list[MeasuredRow], cards: dict[str, object] | None) -> pd.DataFrame:
    """Predictions of every row, each on its card (fitted when ``cards`` has it, else bundled)."""
    frames = []
    for key in dict.fromkeys(card_key(r) for r in rows):
        group = [r for r in rows if card_key(r) == key]
        hw = (cards or {}).get(key)
        frames.append(predict_rows(group, hw))
    frame = pd.concat(frames, ignore_index=True)
    order = {r.id: i for i, r in enumerate(rows)}
    frame = frame.sort_values("row", key=lambda c: c.map(order)).reset_index(drop=True)
    frame["card"] = [card_key(r) for r in rows]
    return frame


def fit_cards(rows: list[MeasuredRow]) -> tuple[dict[str, object], list[dict[str, object]]]:
    """One fitted card per GPU key with fit rows (the rows' overrides stay on the rows)."""
    cards: dict[str, object] = {}
    notes = []
    for key in dict.fromkeys(card_key(r) for r in rows):
        fit_rows = [r for r in rows if card_key(r) == key and r.split == "fit"]
        if not fit_rows:
            notes.append({"card": key, "fit_rows": 0, "values": "(no fit rows: bundled card)", "unidentified": ""})
            continue
        result = fit_hardware(hardware(fit_rows[0].gpu), fit_rows)
        cards[key] = result.hardware
        fitted = {k: v for k, v in result.values.items() if result.identified[k] is True}
        notes.append({"card": key, "fit_rows": len(fit_rows),
                      "values": ", ".join(f"{k}={v:.4g}" for k, v in fitted.items()) or "(none identified)",
                      "unidentified": ", ".join(result.unidentified),
                      "reasons": result.unidentified,
                      "cost_before": result.cost_before, "cost": result.cost})
    return cards, notes


def ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Each row against the first row of its stack: throughput ratio, measured and predicted."""
    out = []
    for stack, group in frame.groupby("stack", observed=True, sort=False):
        if len(group) < 2:
            continue
        base = group.iloc[0]
        for _, row in group.iloc[1:].iterrows():
            measured = row.measured_tokens_per_s_per_gpu / base.measured_tokens_per_s_per_gpu
            predicted = row.predicted_tokens_per_s_per_gpu / base.predicted_tokens_per_s_per_gpu
            split = "predict" if "predict" in (row.split, base.split) else "fit"
            out.append({"stack": stack, "variant": row.row, "against": base.row, "split": split,
                        "measured_ratio": measured, "predicted_ratio": predicted,
                        "ratio_err": predicted / measured - 1.0})
    return pd.DataFrame(out)


def moe_order(frame: pd.DataFrame, rows: list[MeasuredRow]) -> pd.DataFrame:
    """Layouts of one MoE model in one stack: every pair whose measured throughputs differ by
    more than 2 %, and whether sapptk puts the pair in the measured order."""
    from sapptk.models import card

    moe = {r.id for r in rows if card(r.model).moe is not None}
    out = []
    sub = frame[frame.row.isin(moe)]
    for stack, group in sub.groupby("stack", observed=True, sort=False):
        if len(group) < 2:
            continue
        recs = list(group.itertuples())
        pairs = agree = 0
        for i, a in enumerate(recs):
            for b in recs[i + 1:]:
                m = a.measured_tokens_per_s_per_gpu / b.measured_tokens_per_s_per_gpu
                if abs(m - 1) <= 0.02:
                    continue
                pairs += 1
                agree += (m > 1) == (a.predicted_tokens_per_s_per_gpu > b.predicted_tokens_per_s_per_gpu)
        measured = list(group.sort_values("measured_tokens_per_s_per_gpu", ascending=False).row)
        predicted = list(group.sort_values("predicted_tokens_per_s_per_gpu", ascending=False).row)
        out.append({"stack": stack, "layouts": len(group), "pairs": pairs, "pairs_in_measured_order": agree,
                    "measured_order": " > ".join(measured), "predicted_order": " > ".join(predicted)})
    return pd.DataFrame(out)


def summary(frame: pd.DataFrame, ratio: pd.DataFrame) -> pd.DataFrame:
    """Per split: rows, step-time |err| median and max, ratio |err| max, memory |err| median and max."""
    out = []
    for split in ("fit", "predict"):
        part = frame[frame.split == split]
        mem = part.memory_err.dropna().abs()
        rat = ratio[ratio.split == split].ratio_err.abs() if len(ratio) else pd.Series(dtype=float)
        out.append({"split": split, "rows": len(part),
                    "step_median_abs_err": part.step_err.abs().median(), "step_max_abs_err": part.step_err.abs().max(),
                    "ratios": len(rat), "ratio_median_abs_err": rat.median() if len(rat) else np.nan,
                    "ratio_max_abs_err": rat.max() if len(rat) else np.nan,
                    "ratios_within_5pct": int((rat <= 0.05).sum()),
                    "memory_rows": len(mem), "memory_median_abs_err": mem.median() if len(mem) else np.nan,
                    "memory_max_abs_err": mem.max() if len(mem) else np.nan})
    return pd.DataFrame(out)


def by_source(frames: dict[str, pd.DataFrame], rows: list[MeasuredRow]) -> str:
    """Markdown: the held-out rows' step-time |err| median per source, before and after the fit."""
    ref = {r.id: str(r.source.get("ref", "")) for r in rows}
    lines = ["| source | held-out rows | step time median abs err, bundled / fitted | memory median abs err, "
             "bundled / fitted |", "|---|---|---|---|"]
    before, after = (f[f.split == "predict"].assign(source=lambda d: d.row.map(ref)) for f in frames.values())
    for source, b in before.groupby("source", sort=False):
        a = after[after.source == source]
        mem_b, mem_a = b.memory_err.dropna().abs(), a.memory_err.dropna().abs()
        mem = f"{_apct(mem_b.median())} / {_apct(mem_a.median())}" if len(mem_b) else "—"
        lines.append(f"| {source} | {len(b)} | {_apct(b.step_err.abs().median())} / "
                     f"{_apct(a.step_err.abs().median())} | {mem} |")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:+.0f} %"


def _apct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.0f} %"


def markdown(summaries: dict[str, pd.DataFrame], moe: dict[str, pd.DataFrame]) -> str:
    lines = ["| cards | split | rows | step time median / max abs err | ratios: median / max abs err (within 5 %) "
             "| peak memory: rows, median / max abs err | MoE layout pairs in measured order |",
             "|---|---|---|---|---|---|---|"]
    for label, table in summaries.items():
        order = moe[label]
        for _, s in table.iterrows():
            part = order if s.split == "predict" else order.iloc[0:0]
            same = (f"{int(part.pairs_in_measured_order.sum())} of {int(part.pairs.sum())} pairs" if len(part)
                    else "—")
            lines.append(
                f"| {label} | {s.split} | {s.rows} | {_apct(s.step_median_abs_err)} / {_apct(s.step_max_abs_err)} | "
                f"{_apct(s.ratio_median_abs_err)} / {_apct(s.ratio_max_abs_err)} ({s.ratios_within_5pct} of "
                f"{s.ratios}) | {s.memory_rows}, {_apct(s.memory_median_abs_err)} / {_apct(s.memory_max_abs_err)} "
                f"| {same} |")
    return "\n".join(lines)


def row_table(before: pd.DataFrame, after: pd.DataFrame) -> str:
    lines = ["| row | split | card | measured tok/s/GPU | before | after | step err before / after "
             "| memory measured (kind) | memory err before / after |", "|---|---|---|---|---|---|---|---|---|"]
    for (_, b), (_, a) in zip(before.iterrows(), after.iterrows(), strict=True):
        mem = "—" if b.measured_memory_mb != b.measured_memory_mb else \
            f"{b.measured_memory_mb / 1e3:.1f} GB ({b.memory_kind})"
        lines.append(f"| {b.row} | {b.split} | {b.card} | {b.measured_tokens_per_s_per_gpu:,.0f} | "
                     f"{b.predicted_tokens_per_s_per_gpu:,.0f} | {a.predicted_tokens_per_s_per_gpu:,.0f} | "
                     f"{_pct(b.step_err)} / {_pct(a.step_err)} | {mem} | {_pct(b.memory_err)} / {_pct(a.memory_err)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the summary as markdown tables")
    parser.add_argument("--rows", action="store_true", help="with --markdown: the per-row table too")
    args = parser.parse_args()
    t0 = time.perf_counter()
    rows = load_measured_rows(RUNS)
    before = predict(rows, None)
    t1 = time.perf_counter()
    cards, notes = fit_cards(rows)
    t2 = time.perf_counter()
    after = predict(rows, cards)
    frames = {"bundled cards (no fit)": before, "fitted cards": after}
    sums = {k: summary(f, ratios(f)) for k, f in frames.items()}
    moes = {k: moe_order(f, rows) for k, f in frames.items()}
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_colwidth", 60)
    if args.markdown:
        print(markdown(sums, moes))
        print()
        print(by_source(frames, rows))
        print()
        print("| card | fit rows | fitted (identified) | left at the card's value (not identified) |")
        print("|---|---|---|---|")
        for n in notes:
            print(f"| {n['card']} | {n['fit_rows']} | {n['values']} | {n['unidentified'] or '—'} |")
        if args.rows:
            print()
            print(row_table(before, after))
        return
    cols = ["row", "split", "card", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "step_err",
            "memory_kind", "memory_err"]
    for label, frame in frames.items():
        print(f"== {label}")
        print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
        print(ratios(frame).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(moes[label].to_string(index=False))
        print(sums[label].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print()
    print("== fits")
    for n in notes:
        print(n)
    print(f"\n{len(rows)} rows ({sum(r.split == 'fit' for r in rows)} fit, {sum(r.split == 'predict' for r in rows)} "
          f"predict); predict all {t1 - t0:.2f} s, fit {t2 - t1:.2f} s")
    print("targets on predict rows:", TARGETS)


if __name__ == "__main__":
    main()
