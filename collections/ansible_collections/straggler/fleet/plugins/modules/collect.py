#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module half of straggler.fleet.collect: makes a consistent snapshot of the host's straggler
database with the agent's CLI (`straggler snapshot`, SQLite's backup API) in a temporary
directory, and returns where it is and its checksum. The action plugin of the same name fetches
it to the controller and removes the directory. This module must not copy the live database
file itself (a copy of a WAL database being written is not consistent)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: collect
short_description: Fetch a consistent snapshot of each host's straggler database to the controller
version_added: 0.1.0
description:
  - Makes a consistent snapshot of the agent's SQLite database on the host (C(straggler snapshot), which uses
    SQLite's backup API, so the agent can keep writing), fetches it over the task's own connection to
    O(dest)C(/<inventory_hostname>.db) on the controller, and removes the snapshot from the host.
  - This is the air-gapped path, needing nothing but Ansible's connection; M(straggler.fleet.merge) then combines
    the files into one cluster database.
  - The fetched file's SHA-256 is checked against the one computed on the host. An existing file on the
    controller with the same content is left alone, and the task then reports no change.
  - The fetched file is mode 0600 (it holds the host's process command lines). Its content comes from the host
    and is not trusted; M(straggler.fleet.merge) checks it (see its option C(expect_nodes_from_hosts)).
  - A host's snapshot is at most O(max_bytes). A larger database is refused on the host before it is copied, a
    larger snapshot before it is fetched, and a fetched file that turns out larger (a host that misreports its
    size) is removed on the controller; the task then fails, saying the size and the cap, and leaves no file.
  - In check mode nothing is snapshotted or fetched; the task reports what it would fetch and where.
author:
  - The straggler project (!UNKNOWN)
options:
  dest:
    description:
      - Directory on the controller to write C(<inventory_hostname>.db) into (created if missing).
    type: path
    required: true
  db:
    description:
      - Path of the agent's database on the host.
      - Unset, the host's C(straggler_agent_db) (the variable the role that installs the agent uses), else
        C(/var/lib/straggler/straggler.db).
    type: path
    default: /var/lib/straggler/straggler.db
  straggler_bin:
    description:
      - Path of the agent's C(straggler) executable on the host.
      - Unset, C(bin/straggler) in the host's C(straggler_agent_venv) (the role's install path variable), else the
        agent's default install path C(/opt/straggler/venv/bin/straggler); if that is missing, a C(straggler) beside
        the Python running the module, then one on E(PATH).
    type: path
  snapshot_dir:
    description:
      - Directory on the host in which a temporary directory for the snapshot is made; it needs room for a copy
        of the database. The temporary directory is removed after the fetch.
    type: path
    default: /var/tmp
  max_bytes:
    description:
      - The largest snapshot, in bytes, taken from one host. A host whose database or snapshot is larger fails the
        task (nothing is fetched, nothing is left on the controller); raise it for a host whose database is
        known to be that large.
      - The controller checks the fetched file against it too, whatever size the host reported.
    type: int
    default: 4294967296
  owner:
    description:
      - User to own the temporary snapshot on the host. The action plugin sets it to the connection's user when
        privilege escalation (become) is used, so that the connection can read the file it fetches.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - ansible.builtin.action_common_attributes.conn
  - straggler.fleet.attributes
  - straggler.fleet.attributes.host
attributes:
  become:
    support: full
  connection:
    support: full
  delegation:
    support: none
  check_mode:
    support: full
    details: Checks the database and the agent CLI on the host; snapshots and fetches nothing.
notes:
  - The file name on the controller is the inventory hostname, so M(straggler.fleet.merge) can tell the nodes apart
    even before reading them.
seealso:
  - module: straggler.fleet.merge
  - module: ansible.builtin.fetch
"""

EXAMPLES = r"""
- name: Fetch every host's database to the controller
  straggler.fleet.collect:
    dest: ~/.local/share/straggler/results/collected

- name: Snapshot on a roomier file system
  straggler.fleet.collect:
    dest: collected/
    snapshot_dir: /srv/scratch

- name: Take at most 1 GiB from each host
  straggler.fleet.collect:
    dest: collected/
    max_bytes: 1073741824
"""

RETURN = r"""
dest:
  description: The file written on the controller (or that would be, in check mode).
  returned: success
  type: str
  sample: /home/me/straggler/results/collected/gpu-node-01.db
remote_path:
  description: Where the snapshot was made on the host (removed by now).
  returned: success, not in check mode
  type: str
  sample: /var/tmp/straggler-collect-x1y2z3/snapshot.db
checksum:
  description: SHA-256 of the snapshot.
  returned: success, not in check mode
  type: str
  sample: 5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef
size:
  description: Size of the snapshot in bytes (in check mode, of the live database).
  returned: success
  type: int
  sample: 10485760
db:
  description: The database that was snapshotted.
  returned: always
  type: str
  sample: /var/lib/straggler/straggler.db
max_bytes:
  description: The cap on the snapshot's size that applied.
  returned: always
  type: int
  sample: 4294967296
"""

import os
import pwd
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.straggler.fleet.plugins.module_utils.agent_cli import (
    DEFAULT_DB,
    AgentCliError,
    find_straggler_bin,
    privilege_problem,
    run_agent_cli,
)


DEFAULT_MAX_BYTES = 4 << 30


def too_large(what, size, max_bytes):
    """One line saying that `what` of `size` bytes is over the cap, or None when it is not."""
    if size <= max_bytes:
        return None
    return ('%s is %d bytes, more than max_bytes (%d): nothing is fetched from this host; raise max_bytes if '
            'this host is trusted and its database is that large' % (what, size, max_bytes))


def snapshot_to_temp(module, straggler_bin, db, snapshot_dir, owner=None, max_bytes=DEFAULT_MAX_BYTES):
    """Snapshot `db` into a new temporary directory under `snapshot_dir`; returns (path, directory).

    The directory is removed again when the snapshot fails or is larger than max_bytes."""
    try:
        directory = tempfile.mkdtemp(prefix='straggler-collect-', dir=snapshot_dir)
    except OSError as exc:
        raise AgentCliError('cannot make a temporary directory in %s (%s): set snapshot_dir to a writable directory'
                            % (snapshot_dir, exc))
    path = os.path.join(directory, 'snapshot.db')
    try:
        run_agent_cli(module, straggler_bin, ['snapshot', '--db', db, '-o', path])
        if not os.path.isfile(path):
            raise AgentCliError('straggler snapshot exited 0 but wrote no %s: is the agent on this host a matching version?' % path)
        problem = too_large('the snapshot of %s' % db, os.path.getsize(path), max_bytes)
        if problem:
            raise AgentCliError(problem)
        if owner:
            try:
                uid = pwd.getpwnam(owner).pw_uid
            except KeyError:
                raise AgentCliError('owner %s is not a user on this host' % owner)
            for entry in (directory, path):
                os.chown(entry, uid, -1)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return path, directory


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type='path', required=True),
            db=dict(type='path', default=DEFAULT_DB),
            straggler_bin=dict(type='path'),
            snapshot_dir=dict(type='path', default='/var/tmp'),
            max_bytes=dict(type='int', default=DEFAULT_MAX_BYTES),
            owner=dict(type='str'),
        ),
        supports_check_mode=True,
    )
    params = module.params
    db = params['db']
    max_bytes = params['max_bytes']
    try:
        if max_bytes <= 0:
            raise AgentCliError('max_bytes must be a positive number of bytes, not %d' % max_bytes)
        problem = privilege_problem(db)
        if problem:
            raise AgentCliError(problem)
        straggler_bin = find_straggler_bin(module, params['straggler_bin'])
        if not os.path.isfile(db):
            raise AgentCliError('no database at %s: is the agent tracing on this host, or set db' % db)
        # the snapshot holds every page of the database: a database over the cap is refused before it is copied
        problem = too_large('the database %s' % db, os.path.getsize(db), max_bytes)
        if problem:
            raise AgentCliError(problem)
        if module.check_mode:
            module.exit_json(changed=True, db=db, size=os.path.getsize(db), max_bytes=max_bytes,
                             msg='would snapshot %s and fetch it' % db)
        path, directory = snapshot_to_temp(module, straggler_bin, db, params['snapshot_dir'], params['owner'],
                                           max_bytes)
    except AgentCliError as exc:
        module.fail_json(msg=str(exc), db=db, max_bytes=max_bytes, rc=exc.rc, stderr=exc.stderr)
    module.exit_json(changed=True, db=db, remote_path=path, remote_dir=directory, max_bytes=max_bytes,
                     checksum=module.digest_from_file(path, 'sha256'), size=os.path.getsize(path))


if __name__ == '__main__':
    main()
