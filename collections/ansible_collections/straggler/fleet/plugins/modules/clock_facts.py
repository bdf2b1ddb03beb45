#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module half of straggler.fleet.clock_facts: reads the host's CLOCK_MONOTONIC and
CLOCK_REALTIME back to back and returns them. The offset to the controller's clock is computed
by the action plugin of the same name, which times the round trips; this module must not try to
estimate anything itself (it cannot see the controller's clock)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: clock_facts
short_description: Measure a host's clock offset to the controller and its monotonic to realtime mapping
version_added: 0.1.0
description:
  - Sets the fact C(straggler_clock) with the offset of the host's wall clock (C(CLOCK_REALTIME)) to the
    controller's, the uncertainty of that offset, and one (C(CLOCK_MONOTONIC), C(CLOCK_REALTIME)) pair read
    back to back on the host, so the host's monotonic event timestamps can be placed on the controller's timeline.
  - "How it measures: the action plugin runs this module once over the task's connection (it reads the pair,
    bracketing the realtime read between two monotonic reads, several times, and keeps the tightest), then reads
    the host's realtime over the same connection with a tiny raw command (C(date +%s%N)), O(samples) round trips in all,
    noting the controller's realtime just before sending and just after the answer. The round trip with the
    shortest duration wins (NTP style): offset = host time - midpoint of the round trip,
    uncertainty = half that round trip, because the host read its clock somewhere inside it."
  - Over SSH with connection reuse (ControlPersist) a raw command's round trip is a few milliseconds, so the
    uncertainty is a few milliseconds; without connection reuse, or where C(date) cannot print nanoseconds
    (the module is then used for every sample), round trips of 100 ms and more make the uncertainty as large.
    The uncertainty is reported, never hidden; the agents' HTTPS clock exchange (M(straggler.fleet.fleet_query))
    is tighter.
  - The module itself changes nothing and runs in check mode.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - On the controller, the straggler package importable by the Python that runs Ansible (the action plugin
    computes the offset with its clock rules; see the collection's README, Install).
  - On the host, Python 3.8 or later.
options:
  samples:
    description:
      - Number of timed round trips to the host, the module run included (the shortest one gives the offset).
      - Used by the action plugin; the module ignores it.
    type: int
    default: 5
  reads:
    description:
      - Number of back-to-back monotonic/realtime/monotonic reads the module makes; it reports the one with
        the tightest bracket.
    type: int
    default: 5
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - ansible.builtin.action_common_attributes.facts
  - straggler.fleet.attributes
  - straggler.fleet.attributes.host
attributes:
  check_mode:
    support: full
  facts:
    support: full
notes:
  - Privileges - none; it reads the clocks only (no C(become) needed).
  - Offsets are host minus controller (positive means the host's wall clock is ahead).
  - All times are integer nanoseconds.
seealso:
  - module: straggler.fleet.merge
"""

EXAMPLES = r"""
- name: Measure every host's clock offset to the controller
  straggler.fleet.clock_facts:
    samples: 7

- name: Show the offsets
  ansible.builtin.debug:
    msg: >-
      {{ inventory_hostname }}: {{ ansible_facts.straggler_clock.offset_ns / 1e6 }} ms
      +/- {{ ansible_facts.straggler_clock.uncertainty_ns / 1e6 }} ms

- name: Merge collected databases on the controller, aligned with the offsets just measured
  straggler.fleet.merge:
    src: collected/
    dest: cluster.db
    offsets_from_hosts: "{{ ansible_play_hosts_all }}"
  run_once: true
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: dict
  contains:
    straggler_clock:
      description: The host's clock as seen from the controller.
      returned: success
      type: dict
      contains:
        offset_ns:
          description: Host realtime minus controller realtime, in ns (set by the action plugin).
          type: int
          sample: -1234567
        uncertainty_ns:
          description: Half the shortest round trip, in ns; the true offset lies within offset_ns +/- uncertainty_ns.
          type: int
          sample: 2100000
        rtt_ns:
          description: The shortest round trip, in ns.
          type: int
          sample: 4200000
        mono_ns:
          description: The host's CLOCK_MONOTONIC at the instant of RV(ansible_facts.straggler_clock.real_ns).
          type: int
          sample: 912345678901
        real_ns:
          description: The host's CLOCK_REALTIME (ns since the Unix epoch) read with RV(ansible_facts.straggler_clock.mono_ns).
          type: int
          sample: 1732870000123456789
        pair_uncertainty_ns:
          description: Half the width of the monotonic bracket around the realtime read on the host.
          type: int
          sample: 150
        samples:
          description: Number of round trips the offset was chosen from.
          type: int
          sample: 6
        probe:
          description: How the samples were taken, C(command) (raw C(date +%s%N)) or C(module) (module runs only).
          type: str
          sample: command
        method:
          description: The connection the round trips went over (C(ssh) for SSH connections, else the connection's name).
          type: str
          sample: ssh
        measured_at_ns:
          description: The controller's realtime (ns since the epoch) at the middle of the shortest round trip.
          type: int
          sample: 1732870000125000000
mono_ns:
  description: The host's CLOCK_MONOTONIC (module run only; the action plugin moves it into the fact).
  returned: success
  type: int
  sample: 912345678901
real_ns:
  description: The host's CLOCK_REALTIME read with RV(mono_ns).
  returned: success
  type: int
  sample: 1732870000123456789
"""

import time

from ansible.module_utils.basic import AnsibleModule


def read_clock_pair(reads):
    """(mono_ns, real_ns, half_bracket_ns): realtime read between two monotonic reads, `reads`
    times; the read with the tightest bracket wins and its monotonic midpoint is reported."""
    best = None
    for dummy in range(max(1, reads)):
        mono_before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        real_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
        mono_after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        width = mono_after - mono_before
        if best is None or width < best[0]:
            best = (width, (mono_before + mono_after) // 2, real_ns)
    width, mono_ns, real_ns = best
    return mono_ns, real_ns, (width + 1) // 2


def main():
    module = AnsibleModule(
        argument_spec=dict(
            samples=dict(type='int', default=5),
            reads=dict(type='int', default=5),
        ),
        supports_check_mode=True,
    )
    mono_ns, real_ns, pair_uncertainty_ns = read_clock_pair(module.params['reads'])
    module.exit_json(changed=False, mono_ns=mono_ns, real_ns=real_ns, pair_uncertainty_ns=pair_uncertainty_ns)


if __name__ == '__main__':
    main()
