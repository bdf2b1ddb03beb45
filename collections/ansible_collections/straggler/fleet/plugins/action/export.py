# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.export: the core's straggler.analysis.export.export_perfetto on
the controller, once per play (Perfetto's native trace, or Chrome JSON for a dest ending in
.json). It passes the options through and reports the file; building the
timeline is the core's job and must not happen here."""

from __future__ import annotations

import filecmp
import os
import tempfile

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    RESULT_FILE_MODE,
    ControllerAction,
    core_error_types,
    import_core,
    plain,
)


def export_arguments(args):
    """The core's keyword arguments: only the cuts that were given."""
    keywords = {}
    for name in ('since', 'until'):
        if args.get(name) not in (None, ''):
            keywords[name] = args[name]
    if args.get('node'):
        keywords['nodes'] = list(args['node'])
    if args.get('findings') is False:
        keywords['findings'] = False
    if args.get('format'):
        keywords['fmt'] = args['format']
    if args.get('around_findings') is not None:
        keywords['around_findings'] = args['around_findings']
    return keywords


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = dict(
        db=dict(type='path', required=True),
        dest=dict(type='path', required=True),
        format=dict(type='str', choices=['perfetto', 'json']),
        since=dict(type='raw'),
        until=dict(type='raw'),
        node=dict(type='list', elements='str'),
        findings=dict(type='bool', default=True),
        around_findings=dict(type='float'),
    )

    def run_task(self, args, task_vars, result):
        db = os.path.abspath(os.path.expanduser(args['db']))
        dest = os.path.abspath(os.path.expanduser(args['dest']))
        export = import_core('analysis.export')
        try:
            result.update(db=db, dest=dest, format=export.format_for(dest, args.get('format')))
        except core_error_types() as exc:
            raise AnsibleActionFail('export failed: %s' % exc) from None
        if not os.path.isfile(db):
            if self._task.check_mode:
                result.update(skipped=True, changed=False,
                              msg='check mode: %s does not exist yet (the tasks that make it did not run)' % db)
                return result
            raise AnsibleActionFail('%s: no such database; merge the collected databases first (straggler.fleet.merge)' % db)
        if self._task.check_mode:
            result.update(changed=True, msg='would export %s to %s' % (db, dest))
            return result
        keywords = export_arguments(args)
        keywords['fmt'] = result['format']
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            # into a new file beside dest, which replaces dest only when it differs (changed only then)
            fd, fresh = tempfile.mkstemp(prefix='.%s.' % os.path.basename(dest), dir=os.path.dirname(dest))
            os.close(fd)
        except OSError as exc:
            raise AnsibleActionFail('cannot write into %s: %s; check dest' % (os.path.dirname(dest), exc)) from None
        try:
            summary = export.export_perfetto(db, fresh, **keywords)
            changed = not (os.path.isfile(dest) and filecmp.cmp(fresh, dest, shallow=False))
            if changed:
                os.chmod(fresh, RESULT_FILE_MODE)
                os.replace(fresh, dest)
        except core_error_types() as exc:
            raise AnsibleActionFail('export failed: %s' % exc) from None
        finally:
            if os.path.exists(fresh):
                os.unlink(fresh)
        skipped = ''
        if isinstance(summary, dict) and summary.get('skipped'):
            skipped = '; skipped ' + ', '.join('%s events: %s' % (n, why) for why, n in summary['skipped'].items())
        result.update(changed=changed, size=os.path.getsize(dest),
                      msg='%s %s to %s (%s)%s; open it at https://ui.perfetto.dev'
                          % ('exported' if changed else 'unchanged: already exported', db, dest, result['format'], skipped))
        if isinstance(summary, dict):
            result['summary'] = plain(summary)
        return result
