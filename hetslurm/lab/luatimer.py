"""Time the hook's own Lua inside slurmctld: an ``LD_PRELOAD`` wrapper around ``lua_pcall``.

slurmctld's ``job_submit/lua`` runs ``slurm_job_submit`` with ``lua_pcall``; this wrapper adds
the calling thread's CPU time spent in each outermost ``lua_pcall`` (``CLOCK_THREAD_CPUTIME_ID``,
nanoseconds) and the number of calls to two counters in a file it maps shared, named by
``HETSLURM_LUA_TIMER`` in slurmctld's environment. ``hetslurm bench hook`` compiles it with the
system's C compiler into its temporary folder and starts the benchmark's own slurmctld with
it; nothing else is ever started with it. Without a compiler the benchmark leaves the figure
out.

The figure is what the hook's script costs the controller per call (GC steps its allocations
trigger included), without the noise of everything else slurmctld does per submission.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from hetslurm.process import run_command

ENV = "HETSLURM_LUA_TIMER"

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct lua_State lua_State;
typedef int (*pcall_fn)(lua_State *, int, int, int);
static pcall_fn real_pcall;
static volatile uint64_t *counters; /* [0] ns, [1] calls */
static int tried;
static __thread int depth;

static uint64_t thread_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void setup(void) {
  const char *path = getenv("HETSLURM_LUA_TIMER");
  tried = 1;
  if (!path) return;
  int fd = open(path, O_RDWR);
  if (fd < 0) return;
  void *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m != MAP_FAILED) counters = (volatile uint64_t *)m;
}

int lua_pcall(lua_State *L, int nargs, int nresults, int errfunc) {
  if (!real_pcall) {
    real_pcall = (pcall_fn)dlsym(RTLD_NEXT, "lua_pcall");
    if (!real_pcall) abort(); /* no Lua after this object: nothing to wrap */
  }
  if (!tried) setup();
  if (!counters || depth > 0) return real_pcall(L, nargs, nresults, errfunc);
  depth++;
  uint64_t t0 = thread_ns();
  int rc = real_pcall(L, nargs, nresults, errfunc);
  uint64_t t1 = thread_ns();
  depth--;
  __sync_fetch_and_add(&counters[0], t1 - t0);
  __sync_fetch_and_add(&counters[1], 1);
  return rc;
}
"""


def build(folder: Path) -> tuple[Path, Path] | None:
    """Compile the wrapper into ``folder``; returns (shared object, counter file), or None when
    no C compiler is there or it fails."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src = folder / "luatimer.c"
    lib = folder / "luatimer.so"
    counters = folder / "luatimer.counters"
    src.write_text(SOURCE)
    res = run_command([cc, "-O2", "-fPIC", "-shared", "-o", str(lib), str(src), "-ldl"],
                      timeout=120, check=False)
    if res.returncode != 0 or not lib.exists():
        return None
    counters.write_bytes(bytes(4096))
    return lib, counters


def read(counters: Path) -> tuple[int, int]:
    """(nanoseconds, calls) so far."""
    ns, calls = struct.unpack("<QQ", counters.read_bytes()[:16])
    return ns, calls
