# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.collect: runs the collect module (a consistent snapshot of the
host's database in a temporary directory), fetches the snapshot over the task's connection to
`<dest>/<inventory_hostname>.db` on the controller, checks its SHA-256, and removes the temporary
directory on the host; the fetched copy is mode 0600 (it holds the host's command lines). A snapshot
over max_bytes is not fetched (the size the host reports), and a fetched file over it (a host that
misreported) is removed: the task fails and no file is left.
Modelled on ansible.builtin.fetch. It must not read or change the database's content: the
snapshot is the agent's job, merging (and distrusting what a host sent) the core's."""

from __future__ import annotations

import hashlib
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import StragglerAction, host_value_of, with_agent_defaults

MODULE_NAME = 'straggler.fleet.collect'
DEFAULT_MAX_BYTES = 4 << 30       # the module's default (plugins/modules/collect.py), checked here on the controller


def sha256_of(path):
    """SHA-256 of a local file, or None when there is no such file."""
    digest = hashlib.sha256()
    try:
        with open(path, 'rb') as handle:
            for block in iter(lambda: handle.read(1 << 20), b''):
                digest.update(block)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def local_dest(dest_dir, inventory_hostname):
    """The controller path a host's snapshot goes to: <dest_dir>/<inventory_hostname>.db."""
    name = to_text(inventory_hostname)
    if not name or '/' in name or name in ('.', '..'):
        raise AnsibleActionFail('inventory hostname %r cannot be a file name' % name)
    return os.path.join(os.path.abspath(os.path.expanduser(dest_dir)), name + '.db')


def check_size(what, size, max_bytes):
    """AnsibleActionFail when `size` bytes are over max_bytes (nothing of the host's is kept)."""
    if size is not None and size > max_bytes:
        raise AnsibleActionFail('%s is %d bytes, more than max_bytes (%d): nothing is kept from this host; raise '
                                'max_bytes if this host is trusted and its database is that large'
                                % (what, size, max_bytes))


def install_fetched(fetched_path, final_path, expected_sha256):
    """Check the fetched file against the host's checksum, then move it into place unless the
    destination already holds the same content. Returns True when final_path was written."""
    actual = sha256_of(fetched_path)
    if actual != expected_sha256:
        os.unlink(fetched_path)
        raise AnsibleActionFail('the fetched snapshot is corrupt (sha256 %s, the host computed %s): run the task again'
                                % (actual, expected_sha256))
    if sha256_of(final_path) == expected_sha256:
        os.unlink(fetched_path)
        return False
    os.chmod(fetched_path, 0o600)    # the host's processes.cmdline: for the controller's user only
    os.replace(fetched_path, final_path)
    return True


class ActionModule(StragglerAction):

    TRANSFERS_FILES = True
    _supports_check_mode = True

    # db and snapshot_dir unset: the module's defaults (the agent's store path, /var/tmp) apply
    ARGUMENT_SPEC = dict(
        dest=dict(type='path', required=True),
        db=dict(type='path'),
        straggler_bin=dict(type='path'),
        snapshot_dir=dict(type='path'),
        max_bytes=dict(type='int'),
        owner=dict(type='str'),
    )

    def run_task(self, args, task_vars, result):
        final_path = local_dest(args['dest'], task_vars.get('inventory_hostname'))
        max_bytes = args['max_bytes'] if args.get('max_bytes') is not None else DEFAULT_MAX_BYTES
        if max_bytes <= 0:
            raise AnsibleActionFail('max_bytes must be a positive number of bytes, not %d' % max_bytes)

        module_args = dict((name, value) for name, value in args.items() if value is not None)
        # db and straggler_bin left unset: the host's straggler_agent_db / straggler_agent_venv, as the playbooks read
        module_args = with_agent_defaults(module_args, host_value_of(task_vars, self._templar))
        if not module_args.get('owner') and self._connection.become:
            remote_user = self._get_remote_user()
            become_user = self.get_become_option('become_user')
            if remote_user and remote_user != become_user:
                module_args['owner'] = remote_user

        remote_dir = None
        try:
            answer = self._execute_module(module_name=MODULE_NAME, module_args=module_args, task_vars=task_vars)
            if answer.get('failed') or answer.get('unreachable'):
                result.update(answer)
                return result
            if self._task.check_mode:
                result.update(answer)
                result.update(changed=True, dest=final_path,
                              msg='would snapshot %s and fetch it to %s' % (answer.get('db'), final_path))
                return result
            remote_dir = answer.get('remote_dir')
            remote_path = answer['remote_path']
            try:
                reported = int(answer.get('size'))
            except (TypeError, ValueError):
                reported = None
            check_size('the snapshot of %s (as the host reports it)' % answer.get('db'), reported, max_bytes)
            try:
                os.makedirs(os.path.dirname(final_path), exist_ok=True)
                fd, fetched_path = tempfile.mkstemp(prefix='.%s.' % os.path.basename(final_path),
                                                    dir=os.path.dirname(final_path))
                os.close(fd)
            except OSError as exc:
                raise AnsibleActionFail('cannot write into %s: %s; check dest' % (os.path.dirname(final_path), exc)) from None
            try:
                self._connection.fetch_file(remote_path, fetched_path)
                # the host's word on the size is not trusted: the file as it arrived
                check_size('the fetched snapshot of %s' % answer.get('db'), os.path.getsize(fetched_path), max_bytes)
                changed = install_fetched(fetched_path, final_path, answer['checksum'])
            finally:
                if os.path.exists(fetched_path):
                    os.unlink(fetched_path)
            result.update(changed=changed, dest=final_path, remote_path=remote_path, checksum=answer['checksum'],
                          size=answer.get('size'), db=answer.get('db'),
                          msg='%s %s (%d bytes)' % ('fetched' if changed else 'unchanged', final_path, answer.get('size') or 0))
            return result
        finally:
            if remote_dir:
                command = self._connection._shell.remove(remote_dir, recurse=True)
                self._low_level_execute_command(command, sudoable=True)
            self._remove_tmp_path(self._connection._shell.tmpdir)
