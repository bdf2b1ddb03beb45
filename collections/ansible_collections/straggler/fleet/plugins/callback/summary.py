# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Callback straggler.fleet.summary: at the end of the run, prints the tables that
straggler.fleet.aggregate and straggler.fleet.fleet_query tasks returned, with each host's
status, and straggler.fleet.explain's verdict, beside whatever the stdout callback prints. It must not change results, and must not
write into a stdout meant for programs (the json/jsonl callbacks): there it prints to stderr."""

from __future__ import annotations

DOCUMENTATION = r"""
name: summary
type: aggregate
short_description: Print straggler's fleet tables and per-host status at the end of the run
version_added: 0.1.0
description:
  - At the end of the run, after the recap, prints the table returned by every M(straggler.fleet.aggregate) and
    M(straggler.fleet.fleet_query) task, titled with its play and task names, then a status line per host or node
    (unreachable and failed ones with their message), and the missing hosts; and the verdict and ranked findings
    of every M(straggler.fleet.explain) task.
  - A run with no such task (an ad hoc C(ansible gpu -b -m straggler.fleet.query -a "sql=..."), or a playbook that
    runs M(straggler.fleet.query) without aggregating) gets one table per M(straggler.fleet.query) task, every host's
    rows together, as M(straggler.fleet.aggregate) would make it. For ad hoc commands Ansible loads this callback only
    with C(bin_ansible_callbacks = True) in C(ansible.cfg) (or E(ANSIBLE_LOAD_CALLBACK_PLUGINS)).
  - Tables are drawn with C(rich) when it is installed on the controller, else as aligned plain text.
  - Works beside any stdout callback. When the stdout callback writes JSON for programs (C(json), C(jsonl),
    C(ansible.posix.json)), the summary goes to stderr so the JSON stays parseable; notification callbacks such as
    C(junit) are not affected.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - Enable it with C(callbacks_enabled = straggler.fleet.summary) in C(ansible.cfg) (or E(ANSIBLE_CALLBACKS_ENABLED)).
options:
  output:
    description:
      - Where to print. V(auto) prints to stdout, or to stderr when the stdout callback writes JSON.
        V(stdout) and V(stderr) force one; V(off) prints nothing.
    type: str
    default: auto
    choices: [auto, stdout, stderr, 'off']
    env:
      - name: STRAGGLER_SUMMARY_OUTPUT
    ini:
      - section: callback_straggler_summary
        key: output
  max_rows:
    description:
      - The most rows shown per table; the rest are counted.
    type: int
    default: 50
    env:
      - name: STRAGGLER_SUMMARY_MAX_ROWS
    ini:
      - section: callback_straggler_summary
        key: max_rows
"""

import io
import shutil

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

from ansible_collections.straggler.fleet.plugins.plugin_utils.aggregation import HOST_STATUS_COLUMNS, aggregate, host_status_rows

SUMMARISED_ACTIONS = {
    'straggler.fleet.aggregate': 'aggregate',
    'straggler.fleet.fleet_query': 'fleet_query',
    'straggler.fleet.explain': 'explain',
    'straggler.fleet.query': 'query',
}
MACHINE_READABLE_STDOUT = ('json', 'jsonl')


def stdout_is_for_programs(stdout_callback):
    """Whether the configured stdout callback writes JSON that programs parse."""
    short_name = str(stdout_callback or '').rsplit('.', 1)[-1].lower()
    return short_name in MACHINE_READABLE_STDOUT


def _text(value):
    """A value the nodes sent (names, messages, summaries) as printable text, by the core's one rule
    (straggler.text.safe_text: control characters written out, nothing acts on the terminal)."""
    try:
        from straggler.text import safe_text
    except ImportError:  # no core on the controller: no straggler task could run, there is nothing of a node's
        return str(value)
    return safe_text(value)


def _cell(value):
    if value is None:
        return ''
    if isinstance(value, float):
        return '%.3f' % value if abs(value) < 1e6 else '%.6g' % value
    return _text(value)


def plain_table(columns, rows, title=None):
    """An aligned plain-text table (when neither the straggler core nor rich is importable)."""
    cells = [[_cell(column) for column in columns]] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[index]) if index < len(line) else 0 for line in cells) for index in range(len(columns))]
    lines = [_text(title)] if title else []
    for number, line in enumerate(cells):
        lines.append('  '.join(value.ljust(width) for value, width in zip(line, widths)).rstrip())
        if number == 0:
            lines.append('  '.join('-' * width for width in widths))
    return '\n'.join(lines) + '\n'


def table_text(columns, rows, title=None, width=None):
    """The core's table rendering (rich when installed, plain otherwise), or plain_table without the core."""
    try:
        from straggler.render import table_text as core_table_text
    except ImportError:
        return plain_table(columns, rows, title)
    return core_table_text(columns, rows, title=title, width=width)


def _ms(value_ns):
    return None if value_ns is None else round(value_ns / 1e6, 3)


def status_table(kind, result):
    """(columns, rows) of the per-host (aggregate) or per-node (fleet_query) status."""
    if kind == 'aggregate':
        columns = list(HOST_STATUS_COLUMNS)
        rows = host_status_rows(result.get('hosts') or [])
    else:
        columns = ['node', 'address', 'status', 'rows', 'latency ms', 'offset ms', '+/- ms', 'message']
        rows = [[entry.get('host') or entry.get('node'), entry.get('address'), entry.get('status'), entry.get('row_count'),
                 entry.get('latency_ms'), _ms(entry.get('offset_ns')), _ms(entry.get('uncertainty_ns')), entry.get('message')]
                for entry in result.get('nodes') or []]
    return columns, rows


def explain_text(title, result, max_rows=50, width=None):
    """explain's verdict: its one line, the ranked findings, the nodes it could not ask."""
    parts = ['%s\n' % _text('%s: %s' % (title, result.get('msg') or 'no report'))]
    findings = result.get('findings') or []
    if findings:
        rows = [[index, finding.get('severity'), finding.get('node'), finding.get('cause'), finding.get('summary')]
                for index, finding in enumerate(findings[:max_rows] if max_rows >= 0 else findings, 1)]
        parts.append(table_text(['#', 'severity', 'node', 'cause', 'summary'], rows, title='findings', width=width))
    for missing in result.get('missing') or []:
        if hasattr(missing, 'get'):
            parts.append(_text('missing: %s (%s): %s' % (missing.get('node'), missing.get('status'),
                                                         missing.get('message'))) + '\n')
    return ''.join(parts)


def summary_text(kind, title, result, max_rows=50, width=None):
    """The text printed for one summarised task result."""
    if kind == 'explain':
        return explain_text(title, result, max_rows, width)
    columns = list(result.get('columns') or [])
    rows = [list(row) for row in result.get('rows') or []]
    parts = []
    if columns:
        shown = rows[:max_rows] if max_rows >= 0 else rows
        parts.append(table_text(columns, shown, title=title, width=width))
        if len(rows) > len(shown):
            parts.append('... %d more rows (%d in all)\n' % (len(rows) - len(shown), len(rows)))
    else:
        parts.append(_text('%s: no table (%s)' % (title, result.get('msg') or 'no rows')) + '\n')
    status_columns, status_rows = status_table(kind, result)
    if status_rows:
        parts.append(table_text(status_columns, status_rows, title='status', width=width))
    missing = result.get('missing') if kind == 'aggregate' else result.get('failed_nodes')
    if missing:
        parts.append(_text('%s: %s' % ('missing hosts' if kind == 'aggregate' else 'nodes that did not answer',
                                       ', '.join(str(item) for item in missing))) + '\n')
    return ''.join(parts)


class CallbackModule(CallbackBase):

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'straggler.fleet.summary'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self._pending = []
        self._queries = []          # [(title, {host: result})] of straggler.fleet.query tasks, in order
        self._play_name = ''

    def _output(self):
        try:
            choice = self.get_option('output')
        except KeyError:
            choice = 'auto'
        if choice == 'auto':
            stdout_callback = getattr(C, 'DEFAULT_STDOUT_CALLBACK', 'default')
            return 'stderr' if stdout_is_for_programs(stdout_callback) else 'stdout'
        return choice

    def _max_rows(self):
        try:
            return int(self.get_option('max_rows'))
        except (KeyError, TypeError, ValueError):
            return 50

    def _record(self, result):
        task = result._task
        action = getattr(task, 'resolved_action', None) or task.action
        kind = SUMMARISED_ACTIONS.get(action) or SUMMARISED_ACTIONS.get('straggler.fleet.' + str(action))
        if kind is None:
            return
        payload = result._result
        title = '%s%s' % (self._play_name + ': ' if self._play_name else '', task.get_name().strip())
        if kind == 'query':
            if not self._queries or self._queries[-1][0] != task._uuid:
                self._queries.append((task._uuid, title, {}))
            self._queries[-1][2][result._host.get_name()] = payload
            return
        items = payload.get('results') if isinstance(payload.get('results'), list) else [payload]
        for item in items:
            if isinstance(item, dict) and ('columns' in item or 'hosts' in item or 'nodes' in item or item.get('msg')):
                self._pending.append((kind, title, item))

    def _query_tables(self):
        """One aggregate table per straggler.fleet.query task, when the run printed no table of its own."""
        queries, self._queries = self._queries, []
        if self._pending:
            return []
        tables = []
        for dummy, title, by_host in queries:
            try:
                tables.append(('aggregate', title, aggregate(list(by_host), by_host)))
            except Exception as exc:  # no straggler core on the controller: say so instead of a table
                tables.append(('aggregate', title, dict(msg='no table: %s' % str(exc).splitlines()[0])))
        return tables

    def _flush(self):
        tables = self._query_tables()
        pending, self._pending = self._pending + tables, []
        output = self._output()
        if not pending or output == 'off':
            return
        width = min(max(shutil.get_terminal_size((120, 24)).columns, 80), 220)
        text = io.StringIO()
        for kind, title, item in pending:
            text.write('\n' + summary_text(kind, title, item, self._max_rows(), width))
        self._display.display(text.getvalue().rstrip('\n'), stderr=(output == 'stderr'))

    def v2_playbook_on_play_start(self, play):
        self._play_name = play.get_name().strip()

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result)

    def v2_runner_on_unreachable(self, result):
        self._record(result)

    def v2_playbook_on_stats(self, stats):
        self._flush()
