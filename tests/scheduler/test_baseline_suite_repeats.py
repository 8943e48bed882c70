"""Note [Paired repeats] in tensile_tf/scheduler/paired_repeats.py: a method's
CBR is compared only with the other methods' runs of the same repeat (the same
vanilla run), and the medians are over its repeats."""
from tensile_tf.scheduler import paired_repeats as suite


def row(strategy, repeat, cbr, msr, eor=1.2, vmp=800.0):
    return {"model": "ResNet50", "jobs": 2, "link": "capped", "strategy": strategy, "repeat": repeat,
            "cbr": cbr, "msr": msr, "eor": eor, "vmp_MiB": vmp}


def test_wins_are_counted_within_a_repeat_and_medians_over_repeats():
    rows = [row("tensile", 0, 0.11, 0.136), row("capuchin", 0, 0.06, 0.076),
            row("tensile", 1, 0.03, 0.031), row("capuchin", 1, 0.06, 0.080),
            row("tensile", 2, 0.08, 0.102), row("capuchin", 2, 0.08, 0.089),
            row("tensile", 0, 0.5, 0.5) | {"link": "unlimited"}]          # another row group, alone
    out = {(s["link"], s["strategy"]): s for s in suite.paired_summary(rows)}
    tensile, capuchin = out[("capped", "tensile")], out[("capped", "capuchin")]
    assert tensile["cbr_runs"] == [0.11, 0.03, 0.08] and tensile["median_cbr"] == 0.08
    assert tensile["median_msr"] == 0.102 and tensile["repeats"] == 3
    assert tensile["cbr_at_least"] == {"capuchin": "2 of 3"}          # repeats 0 and 2 (a tie counts)
    assert capuchin["cbr_at_least"] == {"tensile": "2 of 3"}          # repeats 1 and 2
    assert out[("unlimited", "tensile")]["cbr_at_least"] == {}


def test_a_repeat_one_method_missed_is_not_compared():
    rows = [row("tensile", 0, 0.05, 0.06), row("capuchin", 0, 0.02, 0.03), row("tensile", 1, 0.01, 0.01)]
    out = {s["strategy"]: s for s in suite.paired_summary(rows)}
    assert out["tensile"]["cbr_at_least"] == {"capuchin": "1 of 1"} and out["tensile"]["repeats"] == 2


def test_a_summary_prints_as_one_line():
    (tensile,) = [s for s in suite.paired_summary([row("tensile", 0, 0.05, 0.06), row("capuchin", 0, 0.02, 0.03)])
                  if s["strategy"] == "tensile"]
    assert suite.summary_line(tensile) == ("ResNet50     x2 capped    tensile        over 1 repeats: median MSR   6.0% "
                                           "EOR  1.20 CBR  0.05 (runs 0.05); CBR at least capuchin's in 1 of 1")
