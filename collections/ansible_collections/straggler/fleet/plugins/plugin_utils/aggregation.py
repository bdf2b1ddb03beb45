# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-in of per-host results into one table, for the aggregate action plugin (and the summary
callback): what status each host's registered result says, and the combined rows with a `node`
column. The rows are combined by the core's one rule (straggler.fleet.combine.combine_answers,
the same as the fleet client over HTTPS): the union of the hosts' columns in first-seen order,
lined up by name, null where a host lacks a column, and the host's status message saying
"columns differ: ..."). No I/O; plain data in and out.

It must not run queries or judge SQL: it only reads what straggler.fleet.query returned.
"""

from __future__ import annotations

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import import_core

MESSAGE_LIMIT = 300


def host_status(host, registered, active_hosts=None, batch_hosts=None):
    """A status dict for one host from its registered query result (None when it has none).

    status is one of ok (rows), empty (answered, no rows), failed, unreachable, skipped,
    missing (nothing registered), pending (nothing registered yet: the host is still in the play
    but in a later batch of `serial`; batch_hosts: the current batch) or invalid (registered from
    something that is not a query);
    answered: whether the status is one the core counts as answered
    (straggler.fleet.client.ANSWERED: ok, empty); message: one line (straggler.text.one_line)."""
    entry = dict(host=host, node=host, status='missing', message='', row_count=0, truncated=False, elapsed_ms=None)
    entry.update(_judged(host, registered, active_hosts, batch_hosts))
    entry['answered'] = entry['status'] in import_core('fleet.client').ANSWERED
    return entry


def _judged(host, registered, active_hosts, batch_hosts=None):
    """The status, message and counts of one host's registered result (see host_status)."""
    one_line = import_core('text').one_line
    entry = {}
    if registered is None:
        if batch_hosts is not None and host not in batch_hosts and (active_hosts is None or host in active_hosts):
            entry.update(status='pending', message='in a later batch (serial): its rows come in that batch\'s table')
        elif active_hosts is not None and host not in active_hosts:
            entry['message'] = 'no result: the host left the play before the query ran (it failed or was unreachable earlier)'
        else:
            entry['message'] = 'no result registered for this host: did the query task run on it?'
        return entry
    if not hasattr(registered, 'get'):
        entry.update(status='invalid', message='the registered value is not a task result')
        return entry
    if registered.get('node'):
        entry['node'] = str(registered.get('node'))
    if registered.get('unreachable'):
        entry.update(status='unreachable', message=one_line(registered.get('msg'), MESSAGE_LIMIT) or 'host unreachable')
    elif registered.get('failed'):
        entry.update(status='failed', message=one_line(registered.get('msg'), MESSAGE_LIMIT) or 'the task failed')
    elif registered.get('skipped'):
        entry.update(status='skipped', message=one_line(registered.get('skip_reason') or registered.get('msg'), MESSAGE_LIMIT) or 'skipped')
    elif isinstance(registered.get('results'), list):
        entry.update(status='invalid',
                     message='the registered result holds a loop\'s results: aggregate one query per host (no loop)')
    elif 'columns' not in registered or 'rows' not in registered:
        entry.update(status='invalid',
                     message='the registered result has no columns/rows: register the result of straggler.fleet.query')
    else:
        rows = registered.get('rows') or []
        entry.update(status='ok' if rows else 'empty', row_count=len(rows),
                     truncated=bool(registered.get('truncated', False)), elapsed_ms=registered.get('elapsed_ms'))
    return entry


def aggregate(hosts, registered_by_host, active_hosts=None, batch_hosts=None, expected_nodes=None):
    """One table from every host's registered query result.

    hosts: inventory hostnames in the order rows should appear.
    registered_by_host: host -> registered result (missing key or None: nothing registered).
    active_hosts: the hosts still in the play (to explain a missing result), or None.
    batch_hosts: the hosts of the current batch under `serial` (the others still in the play are
    pending, not missing), or None.
    expected_nodes: host -> the node name its agent records (straggler_agent_node, by default the
    inventory hostname), or None to take each host's own word: either way a host answers only for
    itself, and two hosts naming one node are both refused (the core's identity rule, status wrong-node).

    Returns dict(columns, rows, hosts, missing, pending, row_count), the table by the core's
    combine_answers (see the module docstring); a host whose columns differ keeps its rows and
    its status message says how."""
    combine = import_core('fleet.combine')
    statuses = []
    answering = []
    for host in hosts:
        registered = registered_by_host.get(host)
        status = host_status(host, registered, active_hosts, batch_hosts)
        statuses.append(status)
        if status['answered']:
            columns = [str(column) for column in (registered.get('columns') or [])]
            problem = combine.identity_problem('host %s' % host, registered.get('node'),
                                               (expected_nodes or {}).get(host), columns, registered.get('rows') or [])
            if problem:
                _refuse(status, problem)
                continue
            answering.append((status, columns, registered.get('rows') or []))
    shared = combine.shared_names([(status['host'], status['node']) for status, dummy, dummy_rows in answering])
    for node, holders in shared.items():
        for status, dummy, dummy_rows in answering:
            if status['host'] in holders:
                _refuse(status, combine.shared_name_message(node, ['host %s' % host for host in holders]))
    answering = [entry for entry in answering if entry[0]['answered']]
    combine_answers = combine.combine_answers
    out_columns, rows, notes = combine_answers([(status['node'], columns, host_rows)
                                                for status, columns, host_rows in answering])
    for (status, dummy, dummy_rows), note in zip(answering, notes):
        if note:
            status['message'] = '; '.join(part for part in (status['message'], note) if part)
    missing = [status['host'] for status in statuses if not status['answered'] and status['status'] != 'pending']
    pending = [status['host'] for status in statuses if status['status'] == 'pending']
    return dict(columns=out_columns, rows=rows, hosts=statuses, missing=missing, pending=pending, row_count=len(rows))


def _refuse(status, message):
    """A host's answer refused by the identity rule: wrong-node, its rows dropped, the reason."""
    status.update(status='wrong-node', message=message, row_count=0, truncated=False, answered=False,
                  node=status['host'])


HOST_STATUS_COLUMNS = ['host', 'node', 'status', 'rows', 'message']


def host_status_rows(statuses):
    """The per-host status as table rows (columns HOST_STATUS_COLUMNS)."""
    return [[status.get('host'), status.get('node'), status.get('status'), status.get('row_count'), status.get('message')]
            for status in statuses]
