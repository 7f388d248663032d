"""The cross-paper view (fnlcore/app/cross_paper.py, rules/cross_paper.smk): cells of different
tables that resolve to one run configuration, each table's reported number beside one reproduction."""

import math

import pandas as pd
import pytest

from fnlcore.app.papers import Scale, load_paper
from fnlcore.app.cross_paper import build_cross_paper, config_key, shared_groups

PAPERS = ("fednoro", "fedncl", "fedmlp", "fedgr", "feddiv")


@pytest.fixture(scope="module")
def paper_scale():
    tables = [t for p in PAPERS for t in load_paper(p, Scale.load("paper"))]
    return shared_groups(tables)


def _group(cp, **key):
    fields = ("dataset", "partition", "noise", "train", "method")
    hits = [g for g in cp.groups if all(dict(zip(fields, g.key))[k] == v for k, v in key.items())]
    assert len(hits) == 1, [g.key for g in hits]
    return hits[0]


def test_paper_scale_groups_on_the_real_tables(paper_scale):
    cp = paper_scale
    # counted on config/papers/*.yaml: every shared configuration is shared within one paper
    # (FedGR's Tables 1/14, 2/15, 3/16 and its ablations; FedDiv's Table 6; Fed-NCL's Table IV; ...)
    assert len(cp.groups) == 290
    assert all(len(g.tables) >= 2 for g in cp.groups)
    assert not [g.key for g in cp.groups if len(g.papers) >= 2]
    # FedAvg under FedCorr noise on CIFAR-10 is FedDiv's only: FedGR's CIFAR-10 noise is its own
    fedavg_fedcorr = {(t.paper) for t in _tables(cp) for tr in t.runs
                      if tr.run.dataset == "cifar10" and tr.run.method.slug() == "fedavg"
                      and tr.run.noise.slug().startswith("fedcorr")}
    assert fedavg_fedcorr <= {"feddiv"}
    # a group: FedNoRo's FedLA on ICH in Tables 1 and 4, same run (partition seed 100, noise seed 0)
    g = _group(cp, dataset="ich_fednoro", method="fedla-tau1.0", noise="hidn-rho0.4-eta0.3-0.5-ha81658")
    assert g.tables == ["fednoro/1", "fednoro/4"] and len(g.runs) == 1
    assert "partition seed 100" in g.describe()
    assert {(c.table.name, c.row) for c in g.cells} == {("fednoro/1", "FedLA"), ("fednoro/4", "CE+LA, FedAvg (= FedLA)")}
    # seeds are not part of the key: the group's runs are the union of its cells' seeds
    g = _group(cp, dataset="cifar10", partition="iid-K100", noise="fedcorr-rho0.8-tau0.0", method="feddiv-wu5")
    assert g.tables == ["feddiv/1", "feddiv/6"] and sorted(r.seed for r in g.runs) == [1, 2, 3, 4, 5]
    assert len({config_key(r) for r in g.runs}) == 1


def _tables(cp):
    return list({id(c.table): c.table for g in cp.groups for c in g.cells}.values())


def _metrics(acc: float, stage: str, rounds: int = 12) -> pd.DataFrame:
    r = list(range(rounds))
    return pd.DataFrame({"round": r, "acc": [acc] * rounds, "bacc": [acc - 0.1] * rounds, "stage": [stage] * rounds})


def test_rendering_from_fabricated_metrics(tmp_path):
    tables = [t for t in load_paper("feddiv", Scale.load("paper")) if t.table in ("4", "6")]
    cp = shared_groups(tables)
    assert [g.tables for g in cp.groups] == [["feddiv/4", "feddiv/6"]] * 2
    assert len(cp.runs()) == 10 and len(set(cp.metrics_files("results"))) == 10
    values = {}
    for i, run in enumerate(cp.runs()):
        stage = "usual" if run.method.name == "fedcorr" else "main"  # the stages each method reports
        values[run.files("results")["metrics"]] = _metrics(0.70 + 0.01 * (i % 5), stage)
    outputs = {"csv": str(tmp_path / "cross_paper.csv"), "md": str(tmp_path / "cross_paper.md")}
    long = build_cross_paper(cp, cp.metrics_files("results"), outputs, values.__getitem__)
    csv = pd.read_csv(outputs["csv"])
    assert len(csv) == len(long) == 4  # 2 groups x (Table 4 cell + Table 6 cell) x 1 metric
    assert set(csv.status) == {"done"} and (csv.n_seeds == 5).all() and set(csv.scale) == {"paper"}
    # the reproduction: mean ± sample std over seeds 1-5, in percent, the same for both tables' cells
    assert csv.reproduced_mean.tolist() == pytest.approx([72.0] * 4)
    assert csv.reproduced_std.tolist() == pytest.approx([math.sqrt(2.5)] * 4)
    fedcorr = csv[csv.method.str.startswith("fedcorr")]
    assert set(fedcorr.row) == {"FedCorr"} and fedcorr.reported.notna().all()
    assert (fedcorr.delta == fedcorr.reproduced_mean - fedcorr.reported).all()
    # both tables print the same number here: spread 0 (FedDiv's Table 6 repeats its Table 4)
    assert (csv.reported_spread == 0).all() and csv.metric_definition.str.contains("highest test acc").all()
    md = (tmp_path / "cross_paper.md").read_text()
    assert "2 run configuration(s)" in md and "0 of them in tables of different papers" in md
    assert "72.00 ± 1.58 (5 seeds)" in md and "| feddiv | 6 | FedCorr |" in md
    # nothing left behind but the two files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cross_paper.csv", "cross_paper.md"]


def test_pending_runs_and_a_scale_not_compared(tmp_path):
    tables = [t for t in load_paper("feddiv", Scale.load("smoke")) if t.table in ("4", "6")]
    cp = shared_groups(tables)
    assert cp.scale == "smoke" and not cp.compared and len(cp.groups) == 2
    from fnlcore.app.cross_paper import cross_paper_long, to_markdown

    long = cross_paper_long(cp, [None] * len(cp.runs()))
    assert set(long.status) == {"not_reported"} and long.reported.isna().all() and (long.n_seeds == 0).all()
    assert "not compared with the reported numbers" in to_markdown(cp, long)
    assert not shared_groups([tables[0]]).groups and shared_groups([tables[0]]).targets("results") == []
