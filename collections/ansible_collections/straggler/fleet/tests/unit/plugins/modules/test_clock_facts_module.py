# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The clock_facts module reads this machine's monotonic and realtime clocks back to back."""

from __future__ import annotations

import time

from ansible_collections.straggler.fleet.plugins.modules import clock_facts


def test_module_returns_this_hosts_clock_pair(run_module):
    before_mono, before_real = time.monotonic_ns(), time.time_ns()
    code, result = run_module(clock_facts.main, dict(reads=3))
    after_mono, after_real = time.monotonic_ns(), time.time_ns()
    assert code == 0, result
    assert result['changed'] is False
    assert before_mono <= result['mono_ns'] <= after_mono
    assert before_real <= result['real_ns'] <= after_real
    # read back to back: realtime minus monotonic matches this process's own reading within the call
    assert abs((result['real_ns'] - result['mono_ns']) - (before_real - before_mono)) <= (after_mono - before_mono) + 1_000_000
    assert 0 <= result['pair_uncertainty_ns'] < 1_000_000


def test_tightest_bracket_wins(monkeypatch):
    # reads: (mono, real, mono) x 2; the second bracket is tighter and must be the one reported
    readings = iter([100, 5000, 900, 2000, 7000, 2010])
    monkeypatch.setattr(clock_facts.time, 'clock_gettime_ns', lambda clock_id: next(readings))
    mono_ns, real_ns, half_width = clock_facts.read_clock_pair(2)
    assert (mono_ns, real_ns, half_width) == (2005, 7000, 5)


def test_runs_in_check_mode(run_module):
    code, result = run_module(clock_facts.main, dict(_ansible_check_mode=True))
    assert code == 0 and result['real_ns'] > 0
