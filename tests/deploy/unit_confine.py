"""unit_confine.py - runs a command under the confinement a systemd unit file gives its service,
as far as it is not systemd's own doing, so that what the unit allows is tried without a running
systemd: the capability bounding set (CapabilityBoundingSet=), no_new_privs (NoNewPrivileges=),
the system-call filter (SystemCallFilter= lines in order, groups expanded by
`systemd-analyze syscall-filter`, SystemCallErrorNumber=) and RestrictNamespaces=, the last two
as seccomp rules through libseccomp (ctypes; no -dev package). Mounts, users and cgroups are
left as they are. Usage: python3 unit_confine.py UNIT [--allow CALL,...] -- COMMAND [ARGS...];
--allow adds calls a test harness around the service needs (Criterion: mincore)."""
import ctypes
import errno
import os
import subprocess
import sys

unit, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
extra = set(sys.argv[3].split(",")) if sys.argv[2] == "--allow" else set()
settings = []
for line in open(unit):
    line = line.strip()
    if line and not line.startswith("#") and "=" in line:
        k, v = line.split("=", 1)
        settings.append((k, v))


def expand(name, seen=None):
    """The system calls of a group (@name) or name itself."""
    if not name.startswith("@"):
        return {name}
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True)
    calls = set()
    for line in out.stdout.splitlines():
        w = line.strip()
        if not w or w.startswith("#") or w == name:
            continue
        if w.startswith("@"):
            calls |= expand(w)
        elif w.replace("_", "").isalnum():
            calls.add(w)
    return calls


allow = None
for k, v in settings:
    if k != "SystemCallFilter":
        continue
    deny = v.startswith("~")
    names = set().union(*(expand(n) for n in v.lstrip("~").split()))
    if allow is None:
        assert not deny, "only an allow list first is handled"
        allow = names
    elif deny:
        allow -= names
    else:
        allow |= names
if allow is not None:
    allow |= extra
err = dict(settings).get("SystemCallErrorNumber", "EPERM")
nns = dict(settings).get("RestrictNamespaces", "no")

CAPS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
        "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_SYS_CHROOT": 18,
        "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21}
libc = ctypes.CDLL(None, use_errno=True)
keep = {CAPS[c] for c in dict(settings).get("CapabilityBoundingSet", "").split()}
last = int(open("/proc/sys/kernel/cap_last_cap").read())
for cap in range(last + 1):
    if cap not in keep and libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        sys.exit(f"unit_confine: could not drop capability {cap}")
if dict(settings).get("NoNewPrivileges") == "yes" and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    sys.exit("unit_confine: could not set no_new_privs")


class Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


sc = ctypes.CDLL("libseccomp.so.2")
sc.seccomp_init.restype = ctypes.c_void_p
sc.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
sc.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
sc.seccomp_load.argtypes = [ctypes.c_void_p]
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO = 0x7FFF0000, lambda e: 0x00050000 | e
deny_act = SCMP_ACT_ERRNO(getattr(errno, err))
ctx = sc.seccomp_init(deny_act if allow is not None else SCMP_ACT_ALLOW)
NS = {"cgroup": 0x02000000, "ipc": 0x08000000, "net": 0x40000000, "mnt": 0x00020000, "pid": 0x20000000,
      "user": 0x10000000, "uts": 0x04000000}
forbidden = [] if nns == "no" else [f for n, f in NS.items() if nns == "yes" or n not in nns.split()]
ns_calls = {"unshare": 0, "clone": 0, "setns": 1}
for name in sorted(allow or []):
    nr = sc.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:
        continue
    if name in ns_calls and forbidden:
        continue  # below: allowed unless a forbidden namespace flag is set
    if sc.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None) != 0:
        sys.exit(f"unit_confine: could not allow {name}")
for name, arg in ns_calls.items():
    if not forbidden or (allow is not None and name not in allow):
        continue
    nr = sc.seccomp_syscall_resolve_name(name.encode())
    mask = sum(forbidden)
    # allowed when (arg & mask) == 0; each forbidden flag set: the error
    rule = Cmp(arg, 7, mask, 0)  # SCMP_CMP_MASKED_EQ
    if sc.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, ctypes.byref(rule)) != 0:
        sys.exit(f"unit_confine: could not add the namespace rule of {name}")
    if allow is None:
        for f in forbidden:
            r = Cmp(arg, 7, f, f)
            sc.seccomp_rule_add_array(ctx, deny_act, nr, 1, ctypes.byref(r))
if sc.seccomp_load(ctx) != 0:
    sys.exit("unit_confine: could not load the filter")
print(f"unit_confine: {len(allow or [])} system calls allowed, namespaces {nns}, "
      f"capabilities {sorted(keep)}", file=sys.stderr, flush=True)
os.execvp(cmd[0], cmd)
