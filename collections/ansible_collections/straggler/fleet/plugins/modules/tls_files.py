#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module straggler.fleet.tls_files: a host's fleet TLS files (CA certificate, revocation list, its
certificate and private key) written in one module run, each atomically and only when it differs.
The straggler_pki role uses it instead of four copy tasks (a copy is a stat and a write per file)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tls_files
short_description: Write a host's fleet TLS files (CA certificate, CRL, certificate, key) in one run
version_added: 0.1.0
description:
  - "Writes the files the straggler agent's mutual TLS reads into O(dest) on the host
    (C(ca.crt), C(crl.pem), C(node.crt) with mode C(0644); C(node.key) with mode C(0600)), each only when its
    content, mode, owner or group differs, through a temporary file in O(dest) renamed over it, so the agent
    never reads half a file (it re-reads them at most once a second: a new CRL takes effect without a restart)."
  - One module run for all four files; the role M(straggler.fleet.straggler_pki) uses it.
  - In check mode it reports which files would change and writes nothing.
author:
  - The straggler project (!UNKNOWN)
options:
  dest:
    description:
      - The directory of the files; it must exist (in check mode, a missing one means every file would be written).
    type: path
    required: true
  ca:
    description: The fleet CA's certificate (PEM), written to C(ca.crt).
    type: str
    required: true
  crl:
    description: The fleet CA's certificate revocation list (PEM), written to C(crl.pem) beside C(ca.crt).
    type: str
    required: true
  cert:
    description: The host's certificate (PEM), written to C(node.crt).
    type: str
    required: true
  key:
    description: The host's private key (PEM), written to C(node.key) with mode C(0600). Never logged.
    type: str
    required: true
  owner:
    description: Owner of the files (a name or a uid); the default keeps the one running the module.
    type: str
  group:
    description: Group of the files (a name or a gid); the default keeps the one running the module.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Privileges - writing into C(/etc/straggler/tls) and setting O(owner) and O(group) needs root on the host (C(become)).
  - The contents are written exactly as given (use C(lookup('ansible.builtin.file', PATH, rstrip=false)) to keep a
    PEM file's last newline, or every run reports a change).
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Install the host's TLS files from the controller's fleet CA directory
  straggler.fleet.tls_files:
    dest: /etc/straggler/tls
    ca: "{{ lookup('ansible.builtin.file', pki_dir ~ '/ca.crt', rstrip=false) }}"
    crl: "{{ lookup('ansible.builtin.file', pki_dir ~ '/crl.pem', rstrip=false) }}"
    cert: "{{ lookup('ansible.builtin.file', pki_dir ~ '/' ~ inventory_hostname ~ '.crt', rstrip=false) }}"
    key: "{{ lookup('ansible.builtin.file', pki_dir ~ '/' ~ inventory_hostname ~ '.key', rstrip=false) }}"
    owner: root
    group: root
  no_log: true
"""

RETURN = r"""
changed_files:
  description: The files written (or, in check mode, that would be), by name.
  returned: always
  type: list
  elements: str
  sample: [crl.pem]
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

# file name, option, mode
FILES = (("ca.crt", "ca", 0o644), ("crl.pem", "crl", 0o644), ("node.crt", "cert", 0o644), ("node.key", "key", 0o600))


def _id(module, value, kind):
    """A uid/gid from a name or a number (None: keep the running user's)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        if kind == "owner":
            import pwd
            return pwd.getpwnam(value).pw_uid
        import grp
        return grp.getgrnam(value).gr_gid
    except KeyError:
        module.fail_json(msg=f"{kind} {value!r} does not exist on this host")


def _differs(path, data, mode, uid, gid):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not os.path.isfile(path) or os.path.islink(path):
        return True
    if (st.st_mode & 0o7777) != mode or (uid is not None and st.st_uid != uid) or (gid is not None and st.st_gid != gid):
        return True
    if st.st_size != len(data):
        return True
    with open(path, "rb") as fh:
        return fh.read() != data


def _write(module, dest, name, data, mode, uid, gid):
    """Write data to dest/name through a temporary file in dest, renamed over it (atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dest)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            if uid is not None or gid is not None:
                os.fchown(fh.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, os.path.join(dest, name))
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        module.fail_json(msg=f"cannot write {os.path.join(dest, name)}: {to_native(exc)}")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            ca=dict(type="str", required=True),
            crl=dict(type="str", required=True),
            cert=dict(type="str", required=True),
            key=dict(type="str", required=True, no_log=True),
            owner=dict(type="str"),
            group=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    if not os.path.isdir(dest):
        if module.check_mode and not os.path.exists(dest):   # a directory the same check run would create
            module.exit_json(changed=True, changed_files=[entry[0] for entry in FILES])
        module.fail_json(msg=f"dest {dest} is not a directory (create it first)")
    uid, gid = _id(module, module.params["owner"], "owner"), _id(module, module.params["group"], "group")
    changed = []
    for name, option, mode in FILES:
        data = to_bytes(module.params[option], errors="surrogate_or_strict")
        if _differs(os.path.join(dest, name), data, mode, uid, gid):
            changed.append(name)
            if not module.check_mode:
                _write(module, dest, name, data, mode, uid, gid)
    module.exit_json(changed=bool(changed), changed_files=changed)


if __name__ == "__main__":
    main()
