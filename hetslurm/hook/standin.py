"""A strict stand-in for Slurm 22.05's job_submit/lua plugin, to run the real hook in-process.

``HookRuntime`` loads a rendered ``job_submit.lua`` into lupa's Lua 5.1 (the version
slurmctld embeds) with:

* a ``slurm`` table holding exactly the constants and functions the 22.05.8 plugin exports
  (read from ``job_submit_lua.so`` and probed on the testbed; ``ESLURM_INVALID_GRES`` and
  most other codes are *not* there in 22.05, so the hook must not rely on them);
  ``slurm.log_*`` and ``slurm.log_user`` run ``string.format`` on their arguments, as the
  plugin's Lua wrappers do;
* a job description whose reads give what the 22.05 getter gives (``nil`` for unset
  strings, ``NO_VAL``/``NO_VAL16`` for unset numbers) and whose writes are **refused** for
  every field the 22.05 setter (``_set_job_req_field`` in
  ``src/plugins/job_submit/lua/job_submit_lua.c``) does not handle; the real plugin drops
  such writes silently, which is how a hook bug hides. Every accepted write is recorded;
* globals closed: the hook may define ``slurm_job_submit`` and ``slurm_job_modify`` while
  it loads and nothing else; a read of an unknown global raises; no ``os``, ``io``,
  ``require``, ``load*`` or ``debug``.

:data:`FIELDS` is the table of fields; docs/hook.md lists it and says where it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetslurm.hook.render import rendered_for
from hetslurm.request import _lua
from hetslurm.site.hook_rules import lua_literal
from hetslurm.slurm import versions

NO_VAL8 = 254
NO_VAL16 = 65534
NO_VAL = 4294967294
NO_VAL64 = 18446744073709551614

# kind: str | u8 | u16 | u32 | u64 | time | bool. "set": the 22.05 setter handles it.
# "default": what the getter gives for a fresh sbatch submission that did not set it.
# "alias": another name for the same job_desc member.
_STR_SET = [
    "account", "acctg_freq", "admin_comment", "array_inx", "batch_features", "burst_buffer",
    "clusters", "comment", "container", "cpus_per_tres", "dependency", "exc_nodes", "extra",
    "features", "licenses", "mail_user", "mem_per_tres", "name", "partition", "prefer", "qos",
    "req_nodes", "reservation", "script", "std_err", "std_in", "std_out", "tres_bind",
    "tres_freq", "tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task", "wckey",
    "work_dir"
]
_STR_READ_ONLY = [
    "alloc_node", "default_account", "default_qos", "user_name", "network", "mcs_label"
]
_NUM_SET: dict[str, tuple[str, int]] = {
    "begin_time": ("time", 0),
    "bitflags": ("u64", 0),
    "contiguous": ("u16", 0),
    "cores_per_socket": ("u16", NO_VAL16),
    "cpu_freq_min": ("u32", NO_VAL),
    "cpu_freq_max": ("u32", NO_VAL),
    "cpu_freq_gov": ("u32", NO_VAL),
    "cpus_per_task": ("u16", NO_VAL16),
    "delay_boot": ("u32", NO_VAL),
    "end_time": ("time", 0),
    "immediate": ("u16", 0),
    "mail_type": ("u16", 0),
    "max_cpus": ("u32", NO_VAL),
    "max_nodes": ("u32", NO_VAL),
    "min_cpus": ("u32", 1),
    "min_nodes": ("u32", NO_VAL),
    "nice": ("u32", NO_VAL),
    "ntasks_per_node": ("u16", NO_VAL16),
    "ntasks_per_socket": ("u16", NO_VAL16),
    "ntasks_per_tres": ("u16", NO_VAL16),
    "num_tasks": ("u32", NO_VAL),
    "shared": ("u16", NO_VAL16),
    "pn_min_cpus": ("u16", NO_VAL16),
    "pn_min_tmp_disk": ("u32", NO_VAL),
    "power_flags": ("u8", 0),
    "priority": ("u32", NO_VAL),
    "reboot": ("u16", NO_VAL16),
    "req_switch": ("u32", NO_VAL),
    "requeue": ("u16", NO_VAL16),
    "site_factor": ("u32", NO_VAL),
    "sockets_per_node": ("u16", NO_VAL16),
    "threads_per_core": ("u16", NO_VAL16),
    "time_limit": ("u32", NO_VAL),
    "time_min": ("u32", NO_VAL),
    "wait4switch": ("u32", NO_VAL),
}
_NUM_READ_ONLY: dict[str, tuple[str, int]] = {
    "argc": ("u32", 0),
    "boards_per_node": ("u16", 0),
    "group_id": ("u32", 0),
    "het_job_offset": ("u32", NO_VAL),
    "ntasks_per_board": ("u16", 0),
    "ntasks_per_core": ("u16", NO_VAL16),
    "sockets_per_board": ("u16", 0),
    "spank_job_env_size": ("u32", 0),
    "user_id": ("u32", 0),
}
_ALIASES = {
    "gres": "tres_per_node",  # the setter prepends "gres:" (gres_prepend_tres_type)
    "ntasks_per_gpu": "ntasks_per_tres",
    "oversubscribe": "shared",
    "pack_job_offset": "het_job_offset",
}


def _fields() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in _STR_SET:
        out[name] = {"kind": "str", "set": True}
    for name in _STR_READ_ONLY:
        out[name] = {"kind": "str", "set": False}
    for name, (kind, default) in _NUM_SET.items():
        out[name] = {"kind": kind, "set": True, "default": default}
    for name, (kind, default) in _NUM_READ_ONLY.items():
        out[name] = {"kind": kind, "set": False, "default": default}
    out["cron_job"] = {"kind": "bool", "set": False, "default": False}
    # pn_min_memory is 64-bit (MEM_PER_CPU flag in the top bit); Lua sees a double. The
    # getters min_mem_per_node / min_mem_per_cpu give nil unless that kind of limit is set.
    out["min_mem_per_node"] = {"kind": "mem", "set": True}
    out["min_mem_per_cpu"] = {"kind": "mem", "set": True}
    out["pn_min_memory"] = {"kind": "u64", "set": True, "default": NO_VAL64}
    for alias, target in _ALIASES.items():
        spec = dict(out[target])
        spec["alias"] = target
        out[alias] = spec
    return out


#: Every job_desc field the 22.05.8 plugin knows, with kind, settable, default and alias.
FIELDS: dict[str, dict[str, Any]] = _fields()

#: What later releases changed in the plugin's job_desc fields (``_get_job_req_field`` and
#: ``_set_job_req_field`` of job_submit_lua.c, slurm-22-05-8-1 against slurm-24-11-5-1 and
#: slurm-26-05-3-1): fields added (with their spec) and removed, each release over the last.
_FIELD_CHANGES: dict[str, tuple[dict[str, dict[str, Any]], tuple[str, ...]]] = {
    "24.11": ({
        "mcs_label": {"kind": "str", "set": True},          # settable from 23.11
        "selinux_context": {"kind": "str", "set": True},    # readable from 23.02.6
        "assoc_comment": {"kind": "str", "set": False},     # 23.02
        "assoc_qos": {"kind": "str", "set": False},         # 24.05.5
    }, ("power_flags",)),                                   # --power dropped in 24.05
    "26.05": ({
        "core_spec": {"kind": "u16", "set": True, "default": NO_VAL16},
        "thread_spec": {"kind": "u16", "set": True, "default": NO_VAL16},
        "segment_size": {"kind": "u16", "set": True, "default": NO_VAL16},
    }, ()),
}


def fields_for(release: str) -> dict[str, dict[str, Any]]:
    """The job_desc fields of ``release``'s plugin (22.05's with each later change applied)."""
    out = dict(FIELDS)
    for name in versions.RELEASES:
        if name == versions.DEFAULT or name > release:
            continue
        added, removed = _FIELD_CHANGES.get(name, ({}, ()))
        out.update(added)
        for f in removed:
            out.pop(f, None)
    return out

#: The ``slurm`` table of the 22.05.8 plugin (constants; functions are added by the harness).
CONSTANTS: dict[str, int] = {
    "SUCCESS": 0,
    "ERROR": -1,
    "FAILURE": -1,
    "ESLURM_ACCESS_DENIED": 2002,
    "ESLURM_ACCOUNTING_POLICY": 2050,
    "ESLURM_INVALID_ACCOUNT": 2045,
    "ESLURM_INVALID_LICENSES": 2048,
    "ESLURM_INVALID_NODE_COUNT": 2006,
    "ESLURM_INVALID_TIME_LIMIT": 2051,
    "ESLURM_JOB_MISSING_SIZE_SPECIFICATION": 2008,
    "ESLURM_MISSING_TIME_LIMIT": 8000,
    "ALLOC_SID_ADMIN_HOLD": 1,
    "ALLOC_SID_USER_HOLD": 2,
    "INFINITE": 4294967295,
    "INFINITE64": 18446744073709551615,
    "NO_VAL": NO_VAL,
    "NO_VAL16": NO_VAL16,
    "NO_VAL8": NO_VAL8,
    "NO_VAL64": NO_VAL64,
    "NICE_OFFSET": 2147483648,
    "MEM_PER_CPU": 9223372036854775808,
    "GRES_ENFORCE_BIND": 16,
    "GRES_DISABLE_BIND": 524288,
    "JOB_SHARED_NONE": 0,
    "JOB_SHARED_OK": 1,
    "JOB_SHARED_USER": 2,
    "JOB_SHARED_MCS": 3,
    "KILL_INV_DEP": 1,
    "NO_KILL_INV_DEP": 2,
    "SHARED_FORCE": 32768,
    "SPREAD_JOB": 256,
    "USE_MIN_NODES": 512,
}

#: From 23.02 the plugin exports every code of slurm_errtab, not only the eight above; these
#: are the ones a hook refuses with (values as in slurm/slurm_errno.h of 24.11 and 26.05).
_LATER_CONSTANTS: dict[str, int] = {
    "ESLURM_INVALID_PARTITION_NAME": 2000,
    "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE": 2014,
    "ESLURM_INVALID_FEATURE": 2029,
    "ESLURM_INVALID_QOS": 2066,
    "ESLURM_INVALID_GRES": 2072,
}


def constants_for(release: str) -> dict[str, int]:
    """The ``slurm`` table's constants in ``release``'s plugin."""
    return dict(CONSTANTS) if release == versions.DEFAULT else {**CONSTANTS, **_LATER_CONSTANTS}


_HARNESS = b"""
local FIELDS, CONSTANTS, RELEASE, GRES = ...
local H = {}
local current = { log = {}, user = {}, writes = {} }

local function fmt(...)
  local n = select('#', ...)
  if n == 0 then return "" end
  return string.format(...)
end

local function make_slurm()
  local s = {}
  for k, v in pairs(CONSTANTS) do s[k] = v end
  local function logger(level)
    return function(...)
      local msg = fmt(...)
      local log = current.log or {}
      current.log = log
      log[#log + 1] = { level, msg }
    end
  end
  s.log_info = logger("info")
  s.log_verbose = logger("verbose")
  s.log_debug = logger("debug")
  s.log_debug2 = logger("debug2")
  s.log_debug3 = logger("debug3")
  s.log_debug4 = logger("debug4")
  s.log_error = logger("error")
  s.error = logger("error")
  -- The log and user-message lists are made when first written (most calls write neither).
  local function add(list_name, item)
    local list = current[list_name] or {}
    current[list_name] = list
    list[#list + 1] = item
  end
  s.log = function(level, msg) add("log", { "log" .. tostring(level), msg }) end
  s.log_user = function(...) add("user", fmt(...)) end
  s.user_msg = function(msg) add("user", msg) end
  s.time_str2mins = function() return -1 end
  s.jobs = {}
  s.reservations = {}
  return s
end

local function unset(spec)
  if spec.kind == "str" or spec.kind == "mem" then return nil end
  return spec.default
end

-- The plugin hands numbers over with lua_pushnumber: floats from Lua 5.3 on (1000.0).
local function pushed(v)
  if math.type and type(v) == "number" then return v + 0.0 end
  return v
end

function H.make_job(values, submit)
  local vals = {}
  for k, v in pairs(values) do vals[k] = pushed(v) end
  local mt = {}
  mt.__index = function(_, k)
    local spec = FIELDS[k]
    if not spec then return nil end
    local v = vals[spec.alias or k]
    if v == nil then return pushed(unset(spec)) end
    return v
  end
  mt.__newindex = function(_, k, v)
    local spec = FIELDS[k]
    if not spec or not spec.set then
      error("job_desc." .. tostring(k) .. " cannot be set by job_submit/lua in Slurm 22.05 "
        .. "(the real plugin would ignore the write)", 2)
    end
    if spec.kind == "str" then
      if type(v) ~= "string" then
        error("job_desc." .. k .. " must be set to a string, not a " .. type(v), 2)
      end
      if k == "gres" and string.sub(v, 1, 5) ~= GRES then v = GRES .. v end
      if string.sub(k, 1, 9) == "tres_per_" then
        -- Slurm validates the job after the hook: a gres written in another release's form
        -- is refused ("gres:gpu:1" from 24.11 on, "gres/gpu:1" on 22.05).
        for entry in string.gmatch(v, "[^,]+") do
          if string.sub(entry, 1, 4) == "gres" and string.sub(entry, 1, 5) ~= GRES then
            current.refused = "Invalid Trackable RESource (TRES) specification: Slurm "
              .. RELEASE .. " refuses " .. k .. "=" .. v .. " (it writes a gres as '" .. GRES
              .. "gpu:...'; was the hook rendered for another release?)"
          end
        end
      end
      local w = current.writes
      w[#w + 1] = k
      w[#w + 1] = v
      if v == "" and submit then v = nil end
      vals[spec.alias or k] = v
      return
    else
      if type(v) ~= "number" then
        error("job_desc." .. k .. " must be set to a number, not a " .. type(v), 2)
      end
      if spec.kind ~= "mem" and spec.kind ~= "u64" and spec.kind ~= "time"
          and (v < 0 or v ~= math.floor(v)) then
        error("job_desc." .. k .. " must be a whole number >= 0, not " .. tostring(v), 2)
      end
    end
    vals[spec.alias or k] = v
    local w = current.writes
    w[#w + 1] = k
    w[#w + 1] = v
  end
  return setmetatable({}, mt)
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

function H.load(text, chunkname)
  local slurm = make_slurm()
  local loading = true
  local allowed = { slurm_job_submit = true, slurm_job_modify = true }
  local G = {
    string = copy(string), table = copy(table), math = copy(math),
    pairs = pairs, ipairs = ipairs, type = type, tostring = tostring, tonumber = tonumber,
    pcall = pcall, error = error, select = select, next = next, unpack = unpack,
    setmetatable = setmetatable, getmetatable = getmetatable, rawget = rawget,
    rawset = rawset, rawequal = rawequal, setfenv = setfenv, assert = assert,
    slurm = slurm,
  }
  G._G = G
  setmetatable(G, {
    __index = function(_, k) error("the hook read the unknown global " .. tostring(k), 2) end,
    __newindex = function(t, k, v)
      if loading and allowed[k] then rawset(t, k, v) return end
      error("the hook wrote the global " .. tostring(k), 2)
    end,
  })
  -- The plugin's own globals for its Lua: setfenv/unpack exist in 5.1 only, load's env
  -- argument from 5.2.
  local chunk, err
  if setfenv then
    chunk, err = loadstring(text, chunkname)
    if chunk then setfenv(chunk, G) end
  else
    chunk, err = load(text, chunkname, "t", G)
  end
  if not chunk then return nil, err end
  current = { writes = {} }
  local ok, rc = pcall(chunk)
  loading = false
  if not ok then return nil, tostring(rc) end
  if rc ~= slurm.SUCCESS then
    return nil, "the script returned " .. tostring(rc) .. " when loaded, not slurm.SUCCESS"
  end
  if type(rawget(G, "slurm_job_submit")) ~= "function"
      or type(rawget(G, "slurm_job_modify")) ~= "function" then
    return nil, "the script does not define slurm_job_submit and slurm_job_modify"
  end
  return G
end

function H.submit(G, job, uid)
  current = { writes = {} }
  local ok, rc = pcall(rawget(G, "slurm_job_submit"), job, {}, pushed(uid or 0))
  local out = current
  out.ok = ok
  if ok then out.rc = rc else out.err = tostring(rc) end
  return out
end

function H.modify(G, job, rec, uid)
  current = { writes = {} }
  local ok, rc = pcall(rawget(G, "slurm_job_modify"), job, rec, {}, pushed(uid or 0))
  local out = current
  out.ok = ok
  if ok then out.rc = rc else out.err = tostring(rc) end
  return out
end

return H
"""


@dataclass(frozen=True)
class CallResult:
    """What one call of the hook did."""

    ok: bool  # False: the hook raised (slurmctld would log it and fail the call)
    rc: int | None
    error: str | None
    writes: tuple[tuple[str, Any], ...]
    user_messages: tuple[str, ...]
    log: tuple[tuple[str, str], ...]
    #: Why slurmctld would refuse the job after the hook accepted it (a field it wrote in a
    #: form this Slurm release does not take), or None.
    refused: str | None = None

    @property
    def accepted(self) -> bool:
        return self.ok and self.rc == 0 and self.refused is None

    @property
    def fields(self) -> dict[str, Any]:
        """The last value written to each field."""
        return dict(self.writes)


@dataclass
class HookRuntime:
    """One rendered hook loaded into a fresh runtime (Lua 5.1, or ``$HETSLURM_LUA``) with the
    strict stand-ins of one Slurm release: ``slurm`` (``"24.11"``), by default the release
    the text was rendered for."""

    text: str
    chunkname: str = "job_submit.lua"
    slurm: str | None = None
    #: The release the stand-in plays (from ``slurm`` or the text).
    release: versions.Release = field(init=False)
    _lua: Any = field(default=None, init=False, repr=False)
    _h: Any = field(default=None, init=False, repr=False)
    _g: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._lua = _lua.new_runtime()
        self.release = release = versions.release(self.slurm or rendered_for(self.text))
        fields = self._lua.execute(b"return " + lua_literal(fields_for(release.name)).encode())
        constants = self._lua.execute(
            b"return " + lua_literal(constants_for(release.name)).encode())
        self._h = self._lua.execute(_HARNESS, fields, constants, release.name.encode(),
                                    release.gres_prefix.encode())
        result = self._h.load(self.text.encode("utf-8"), ("@" + self.chunkname).encode())
        parts = list(result) if isinstance(result, tuple) else [result]
        g, err = ([*parts, None, None])[:2]
        if g is None:
            raise HookLoadError(_lua.to_python(err) if err is not None else "cannot load")
        self._g = g

    def job(self, values: Mapping[str, Any], *, submit: bool = True) -> Any:
        """A stand-in job description (a Lua table) from field values; strings as str."""
        return self._h.make_job(self._lua.table_from(_to_lua(values)), submit)

    def submit(self, values: Mapping[str, Any] | Any, uid: int = 0) -> CallResult:
        job = values if not isinstance(values, Mapping) else self.job(values)
        return _result(self._h.submit(self._g, job, uid))

    def submit_raw(self, job: Any, uid: int = 0) -> Any:
        """Call ``slurm_job_submit`` on a prepared job; no conversion (for benchmarks)."""
        return self._h.submit(self._g, job, uid)

    def modify(self, desc: Mapping[str, Any], record: Mapping[str, Any], uid: int = 0
               ) -> CallResult:
        """Call ``slurm_job_modify``: ``desc`` the update, ``record`` the job as it is."""
        job = self._h.make_job(self._lua.table_from(_to_lua(desc)), False)
        rec = self._lua.table_from(_to_lua(record))
        return _result(self._h.modify(self._g, job, rec, uid))


class HookLoadError(Exception):
    """The rendered hook does not load (slurmctld would refuse it, fatally at start)."""


def _to_lua(values: Mapping[str, Any]) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for k, v in values.items():
        if v is None:
            continue
        out[k.encode()] = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
    return out


def _result(out: Any) -> CallResult:
    data = _lua.to_python(out)
    writes = data.get("writes") or []
    log = data.get("log") or []
    user = data.get("user") or []
    rc = data.get("rc")
    return CallResult(
        ok=bool(data.get("ok")),
        rc=int(rc) if isinstance(rc, int | float) else None,
        error=data.get("err"),
        writes=_pairs(writes),
        user_messages=tuple(user if isinstance(user, list) else []),
        log=tuple((e[0], e[1]) for e in (log if isinstance(log, list) else [])),
        refused=data.get("refused"),
    )


def _pairs(flat: Any) -> tuple[tuple[str, Any], ...]:
    """The stand-in records writes as a flat list ``field, value, field, value, ...``
    (no table per write, so the recording costs the timed call little)."""
    if not isinstance(flat, list):
        return ()
    return tuple((flat[i], _num(flat[i + 1])) for i in range(0, len(flat) - 1, 2))


def _num(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v
