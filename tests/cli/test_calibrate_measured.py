"""``blueprinting calibrate --gemm / --nccl / --stream``: the fixtures in tests/hardware/data
(figures from shared/reference/microbenchmarks.json, each file's first line says which rows),
the written [system] section read back by `plan`, and bad files refused with line numbers."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from blueprinting.cli.main import main
from blueprinting.hardware.efficiency import ConstantEfficiency, GemmShapeEfficiency
from blueprinting.hardware.system_mapping import load_system
from blueprinting.mapping.model import Datatype

DATA = Path(__file__).resolve().parents[1] / "hardware" / "data"
NCCL = DATA / "nccl_tests_all_reduce_a100.txt"
GEMM = DATA / "gemm_sweep_a100.csv"
STREAM = DATA / "babelstream_a100.txt"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _plan(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any], str]:
    """``plan --json`` of GPT 1.7B, t = 2 on 8 GPUs (the preset system unless ``extra`` says)."""
    code, stdout, stderr = _run(
        capsys,
        "plan",
        "--model",
        "gpt-1.7b",
        "--gpus",
        "8",
        "--set",
        "tensor_model_parallel_size=2",
        *extra,
        "--no-simulate",
        "--json",
    )
    return code, (json.loads(stdout) if code == 0 else {}), stderr


def test_calibrate_nccl_writes_a_system_that_plan_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "system.toml"
    code, stdout, _ = _run(capsys, "calibrate", "--nccl", str(NCCL), "--out", str(out))
    assert code == 0
    assert (
        "intra link, ring collectives: latency 44.2 us, bus bandwidth 204.7 GB/s = 0.682 of "
        "300.0 GB/s" in stdout
    )
    assert "24 points, RMS 13.2%, max 30.2%" in stdout
    system = load_system(out)
    assert system.node.link.latency_s == pytest.approx(44.24e-6, rel=1e-3)
    efficiency = system.node.link.efficiency
    assert isinstance(efficiency, ConstantEfficiency)
    assert efficiency.fraction == pytest.approx(0.6823, rel=1e-3)
    # Everything else is the preset's.
    assert system.scale_out.latency_s == 20e-6
    code, calibrated, stderr = _plan(capsys, "--system", str(out))
    assert code == 0, stderr
    # The same plan as the preset with the two fitted figures set by hand.
    code, by_hand, _ = _plan(
        capsys,
        "--set",
        f"system.intra_node.latency_s={system.node.link.latency_s!r}",
        "--set",
        f"system.intra_node.efficiency={efficiency.fraction!r}",
    )
    assert code == 0
    assert by_hand["time_breakdown_s"] == calibrated["time_breakdown_s"]
    code, preset, _ = _plan(capsys)
    assert (
        calibrated["time_breakdown_s"]["tp_comm_exposed"]
        != preset["time_breakdown_s"]["tp_comm_exposed"]
    )
    assert calibrated["time_breakdown_s"]["forward"] == preset["time_breakdown_s"]["forward"]


def test_calibrate_all_three_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "system.toml"
    code, stdout, _ = _run(
        capsys,
        "calibrate",
        "--gemm",
        str(GEMM),
        "--nccl",
        str(NCCL),
        "--stream",
        str(STREAM),
        "--out",
        str(out),
    )
    assert code == 0
    assert (
        "gemm float16: peak_fraction 0.808, half_saturation_dim 113, half_saturation_flops "
        "2.24e+09; fitted 8 points, RMS 5.9%, max 12.3%; leave-one-out 8 points, RMS 45.9%, "
        "max 125.2%"
    ) in stdout
    assert "hbm: Triad 0.834 of datasheet (copy 0.790, mul 0.790, add 0.834" in stdout
    section = tomllib.loads(out.read_text())["system"]
    assert section["preset"] == "dgx-a100-80gb"
    assert section["accelerator"]["hbm"] == {"efficiency": pytest.approx(1700 / 2039)}
    system = load_system(out)
    fp16 = next(r for r in system.accelerator.matrix.rates if r.datatype == Datatype.FP16)
    assert isinstance(fp16.efficiency, GemmShapeEfficiency)
    assert fp16.efficiency.peak_fraction == pytest.approx(0.808, abs=1e-3)
    assert fp16.peak_flop_per_s == 312e12  # the preset's peak, merged
    bf16 = next(r for r in system.accelerator.matrix.rates if r.datatype == Datatype.BF16)
    assert bf16.efficiency != fp16.efficiency  # not in the CSV: the preset's


def test_calibrate_prints_the_section_without_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = _run(capsys, "calibrate", "--stream", str(STREAM), "--system", "dgx-h100")
    assert code == 0
    toml_text = stdout[stdout.index("[system]") :]
    section = tomllib.loads(toml_text)["system"]
    assert section["preset"] == "dgx-h100"
    assert section["accelerator"]["hbm"]["efficiency"] == pytest.approx(1700 / 3350)


def _nccl_text() -> list[str]:
    return NCCL.read_text().splitlines()


def test_a_truncated_nccl_row_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _nccl_text()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576 "))
    lines[row] = lines[row][:60]
    bad = tmp_path / "ar.txt"
    bad.write_text("\n".join(lines[: row + 1]))
    code, _, stderr = _run(capsys, "calibrate", "--nccl", str(bad))
    assert code == 2
    assert f"invalid configuration in {bad}:" in stderr
    assert f"line {row + 1}: 6 field(s), the header on line 18 has 13 (a truncated row?)" in stderr
    assert "Traceback" not in stderr


def test_an_nccl_file_without_header_or_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [line for line in _nccl_text() if "Collective test" not in line]
    header = next(i for i, line in enumerate(lines) if line.lstrip("#").split()[:1] == ["size"])
    del lines[header]
    bad = tmp_path / "ar.txt"
    bad.write_text("\n".join(lines))
    code, _, stderr = _run(capsys, "calibrate", "--nccl", str(bad))
    assert code == 2
    assert f"line {header + 2}: a data row before the nccl-tests column header" in stderr
    assert "no nccl-tests column header (#  size  count  type ... busbw ...) found" in stderr
    assert "pass --nccl-op" in stderr


def test_an_inter_node_rate_above_the_nic_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same rows on two hosts: 230 GB/s busbw is no ring over one 25 GB/s NIC.
    lines = [
        line.replace("ndv4-node-01", "ndv4-node-02") if " Rank  5 " in line else line
        for line in _nccl_text()
    ]
    two_hosts = tmp_path / "ar.txt"
    two_hosts.write_text("\n".join(lines))
    code, _, stderr = _run(capsys, "calibrate", "--nccl", str(two_hosts))
    assert code == 2
    assert (
        f"{two_hosts} (inter link, ring collectives): fitted bus bandwidth 204.7 GB/s is 8.19 "
        "of the link's" in stderr
    )
    # Told it is the intra-node link, the same file fits.
    code, _, _ = _run(capsys, "calibrate", "--nccl", str(two_hosts), "--nccl-scope", "intra")
    assert code == 0


def test_bad_gemm_rows_name_their_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "gemm.csv"
    bad.write_text("M,N,K,dtype,TFLOP/s\n1024,1024,1024,bf61,100\n2048,-1,2048,bf16,x\n4096,4096\n")
    code, _, stderr = _run(capsys, "calibrate", "--gemm", str(bad))
    assert code == 2
    assert "line 2: unknown dtype 'bf61' (did you mean 'bf16'?); choices: bf16, fp16, fp8" in stderr
    assert "line 3: N '-1' is not a positive integer" in stderr
    assert "line 3: TFLOP/s 'x' is not a positive number" in stderr
    assert "line 4: 2 field(s), the header has 5" in stderr


def test_a_gemm_csv_without_its_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "gemm.csv"
    bad.write_text("# a sweep\nm,n,k,tflops\n1,2,3,4\n")
    code, _, stderr = _run(capsys, "calibrate", "--gemm", str(bad))
    assert code == 2
    assert "line 2: the header lacks column(s) dtype (got m, n, k, tflops)" in stderr


def test_too_few_gemm_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    short = tmp_path / "gemm.csv"
    short.write_text("\n".join(GEMM.read_text().splitlines()[:5]))
    code, _, stderr = _run(capsys, "calibrate", "--gemm", str(short))
    assert code == 2
    assert "float16: fitting a GEMM efficiency needs at least 4 shapes" in stderr


def test_a_truncated_babelstream_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = STREAM.read_text().splitlines()
    triad = next(i for i, line in enumerate(lines) if line.startswith("Triad"))
    bad = tmp_path / "stream.txt"
    bad.write_text("\n".join([*lines[:triad], "Triad       1700000.0"]))
    code, _, stderr = _run(capsys, "calibrate", "--stream", str(bad))
    assert code == 2
    assert (
        f"line {triad + 1}: a Triad row needs a rate and min / max / average times, "
        "got 'Triad       1700000.0'"
    ) in stderr
    bad.write_text("\n".join(lines[:triad]))
    code, _, stderr = _run(capsys, "calibrate", "--stream", str(bad))
    assert code == 2
    assert "the result table has no Triad row (a truncated run?)" in stderr


def test_measurements_and_runs_are_not_mixed(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, stderr = _run(
        capsys, "calibrate", "--stream", str(STREAM), "--fit", "korthikanti2022_table4"
    )
    assert code == 2
    assert "give one kind" in stderr
    code, _, stderr = _run(capsys, "calibrate", "--out", "x.toml")
    assert code == 2
    assert "--out, --nccl-scope and --nccl-op need --gemm, --nccl or --stream" in stderr


def test_alltoall_files_set_the_links_all_to_all_efficiency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ``alltoall_perf`` file is fitted apart from the ring collectives and sets
    ``all_to_all_efficiency`` only (the A100 rows relabelled: the fit's figures are the
    all-reduce file's); with an ``all_reduce_perf`` file beside it each sets its own."""
    a2a = tmp_path / "a2a.txt"
    a2a.write_text("\n".join(_nccl_text()).replace("all_reduce_perf", "alltoall_perf"))
    out = tmp_path / "system.toml"
    code, stdout, stderr = _run(capsys, "calibrate", "--nccl", str(a2a), "--out", str(out))
    assert code == 0, stderr
    assert "intra link, all-to-all: latency 22.1 us, bus bandwidth 204.7 GB/s" in stdout
    section = tomllib.loads(out.read_text())["system"]
    assert section["intra_node"] == {"all_to_all_efficiency": pytest.approx(0.6823, rel=1e-3)}
    system = load_system(out)
    assert system.node.link.efficiency == ConstantEfficiency(fraction=0.69)  # the preset's
    code, _, stderr = _run(
        capsys, "calibrate", "--nccl", str(a2a), "--nccl", str(NCCL), "--out", str(out)
    )
    assert code == 0, stderr
    both = load_system(out).node.link
    assert isinstance(both.efficiency, ConstantEfficiency)
    assert isinstance(both.all_to_all_efficiency, ConstantEfficiency)
    # the same rows fitted under each op's wire factor: the same rate
    assert both.efficiency.fraction == pytest.approx(both.all_to_all_efficiency.fraction)
    assert both.latency_s == pytest.approx(44.24e-6, rel=1e-3)


def test_a_one_host_alltoall_cannot_set_the_nics_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a2a = tmp_path / "a2a.txt"
    a2a.write_text("\n".join(_nccl_text()).replace("all_reduce_perf", "alltoall_perf"))
    code, _, stderr = _run(capsys, "calibrate", "--nccl", str(a2a), "--nccl-scope", "inter")
    assert code == 2
    assert f"{a2a}: an all-to-all over 8 ranks on 1 host(s) stays inside one NVLink domain" in (
        stderr
    )
    assert "Traceback" not in stderr


def test_an_alltoall_across_hosts_is_read_as_the_nics_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The A100 rows relabelled as an all-to-all over 8 ranks on 2 hosts (4 each): the NIC
    carries (8 - 4) / (8 - 1) of the busbw, so the fitted NIC rate is 4/7 of the busbw line's
    204.7 GB/s = 117.0 GB/s, above a 25 GB/s NIC: refused, naming the fit."""
    lines = [
        line.replace("ndv4-node-01", "ndv4-node-02")
        if any(f" Rank  {r} " in line for r in (4, 5, 6, 7))
        else line
        for line in _nccl_text()
    ]
    a2a = tmp_path / "a2a.txt"
    a2a.write_text("\n".join(lines).replace("all_reduce_perf", "alltoall_perf"))
    code, _, stderr = _run(capsys, "calibrate", "--nccl", str(a2a))
    assert code == 2
    assert f"{a2a} (inter link, all-to-all): fitted bus bandwidth 117.0 GB/s" in stderr
    assert "an all-to-all's rate is read as one link's share" in stderr
    assert "NCCL_ALGO=Ring" not in stderr


def _alltoall_text(hosts: int, per_host: int, busbw_gbps: float, latency_us: float) -> str:
    """nccl-tests 2.13 ``alltoall_perf`` output over ``hosts`` x ``per_host`` ranks whose busbw
    approaches ``busbw_gbps`` (time = latency + size (n-1)/n / busbw), 1 MiB to 8 GiB."""
    n = hosts * per_host
    lines = [
        "# Collective test starting: alltoall_perf",
        "# Synthetic rows for a test: busbw by construction, not a measurement.",
        "#",
        "# Using devices",
    ]
    for rank in range(n):
        host = f"dgx-node-{rank // per_host:02d}"
        device = rank % per_host
        lines.append(
            f"#  Rank {rank:2d} Group  0 Pid {40000 + rank} on {host} device  {device} "
            "[0x07] NVIDIA H100 80GB HBM3"
        )
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
        "     (us)  (GB/s)  (GB/s)       ",
    ]
    for power in range(20, 34):
        size = 2**power
        time_us = latency_us + size * (n - 1) / n / (busbw_gbps * 1e3)
        algbw = size / time_us / 1e3
        busbw = algbw * (n - 1) / n
        figures = f"{time_us:8.1f} {algbw:7.2f} {busbw:7.2f}      0"
        lines.append(f"{size:12d} {size // 4:13d}     float    none      -1 {figures} {figures}")
    return "\n".join(lines) + "\n"


def test_nvidias_32_gpu_alltoall_calibrates_the_presets_nic_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An alltoall_perf over 4 DGX H100 (32 ranks) at 48 GB/s busbw, NVIDIA's GTC25 figure
    (microbenchmarks.md 4.1): the NIC carries 24/31 of it, 37.2 GB/s = 0.74 of 50, the figure
    the dgx-h100 preset carries (presets.NIC_ALL_TO_ALL)."""
    a2a = tmp_path / "a2a.txt"
    a2a.write_text(_alltoall_text(hosts=4, per_host=8, busbw_gbps=48.0, latency_us=30.0))
    out = tmp_path / "system.toml"
    code, stdout, stderr = _run(
        capsys, "calibrate", "--system", "dgx-h100", "--nccl", str(a2a), "--out", str(out)
    )
    assert code == 0, stderr
    assert "inter link, all-to-all:" in stdout
    fitted = tomllib.loads(out.read_text())["system"]["scale_out"]["all_to_all_efficiency"]
    assert fitted == pytest.approx(48 * 24 / 31 / 50, rel=1e-2)
    assert round(fitted, 2) == 0.74
