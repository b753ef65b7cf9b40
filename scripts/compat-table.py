#!/usr/bin/env python3
"""Compares two runs of llama-server's own test suite (the JUnit XML files that
server-tests.sh leaves in its results directory): one on llama-server, one on
llama-hdd-server. Prints, per test file, what each passed, and then every test
that llama-server passes and ours does not, with the first line of its failure.

usage: compat-table.py REF_RESULTS_DIR OURS_RESULTS_DIR [FILE_STEM ...]
"""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(path):
    """{test name: (passed, reason)} of one JUnit file."""
    root = ET.parse(path).getroot()
    out = {}
    for case in root.iter("testcase"):
        name = case.get("name")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped") is not None
        if bad is not None:
            reason = (bad.get("message") or bad.text or "").strip().splitlines()
            out[name] = (False, reason[0][:160] if reason else "")
        elif skipped:
            out[name] = (None, "skipped")
        else:
            out[name] = (True, "")
    return out


def main():
    ref, ours = Path(sys.argv[1]), Path(sys.argv[2])
    stems = sys.argv[3:] or sorted(p.stem for p in ref.glob("*.xml"))
    total_ref = total_both = 0
    lost = []
    print("| file | llama-server passes | ours passes | ours of those llama-server passes |")
    print("|---|---|---|---|")
    for stem in stems:
        r_path, o_path = ref / f"{stem}.xml", ours / f"{stem}.xml"
        if not r_path.exists():
            continue
        r = outcomes(r_path)
        o = outcomes(o_path) if o_path.exists() else {}
        r_pass = {n for n, (ok, _) in r.items() if ok}
        o_pass = {n for n, (ok, _) in o.items() if ok}
        both = r_pass & o_pass
        total_ref += len(r_pass)
        total_both += len(both)
        print(f"| {stem} | {len(r_pass)} | {len(o_pass)} | {len(both)} |")
        for n in sorted(r_pass - o_pass):
            lost.append((stem, n, o.get(n, (False, "not run"))[1]))
    pct = 100.0 * total_both / total_ref if total_ref else 0.0
    print(f"| **all** | **{total_ref}** | | **{total_both} ({pct:.1f}%)** |")
    print()
    for stem, name, reason in lost:
        print(f"- `{stem}::{name}`: {reason}")


if __name__ == "__main__":
    main()
