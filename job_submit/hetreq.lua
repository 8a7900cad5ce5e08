-- hetreq.lua: the hetslurm request grammar, implemented once.
--
-- The same file runs in two places: inside slurmctld (the job_submit hook embeds or requires it;
-- Slurm 22.05's job_submit_lua.so links Lua 5.1) and in Python through lupa's Lua 5.1
-- (hetslurm/request/_lua.py). docs/requests.md documents every element.
--
-- Rules this module keeps, because the controller runs it under its locks:
--   * Lua 5.1 only; everything `local`; no globals read after load, none written ever;
--   * no I/O, no os/io/debug/package use, no error() for user input: a bad request returns
--     nil plus one printable-ASCII line that names the token and what is accepted;
--   * bounded work: the input is at most MAX_BYTES bytes and MAX_TOKENS tokens;
--   * every number it returns is an exact integer below 2^31, so tostring() prints it as
--     digits (Lua 5.1 numbers are doubles; Slurm refuses "2.0" or "1e+15" in a count).

local string_byte = string.byte
local string_find = string.find
local string_format = string.format
local string_gmatch = string.gmatch
local string_gsub = string.gsub
local string_lower = string.lower
local string_match = string.match
local string_sub = string.sub
local table_concat = table.concat
local math_floor = math.floor
local math_min = math.min
local tonumber = tonumber
local type = type
local pairs = pairs
local ipairs = ipairs

local M = {}

M.VERSION = 1

-- A Slurm job comment holds at most 1024 bytes; srun/salloc carry the request there.
M.MAX_BYTES = 1024
-- 16 keys exist and none may repeat, so more tokens than this is always a mistake.
M.MAX_TOKENS = 32
-- Alternatives in one any-of list (gpu-type=a|b|c, fpga=a|b:N).
M.MAX_MODELS = 16

-- Bounds, documented in docs/requests.md. Generous but finite: a typo such as gpus=4000000
-- is refused here instead of reaching slurmctld as a count near 2^32.
M.LIMITS = {
  nodes = 65536,
  gpus_per_node = 64,        -- = hetslurm.site.schema.MAX_DEVICES_PER_NODE
  gpus_per_job = 65536,
  fpgas_per_node = 64,
  cores_per_node = 16384,    -- 16 sockets x 1024 cores, the site schema's largest node
  mem_mib = 67108864,        -- 64 TiB, the site schema's MAX_MEMORY_MIB
  switch_wait_s = 86400,     -- one day; the site's max_switch_wait caps it further in Slurm
  wait_for_max_s = 604800,   -- one week: wait-for=first,max=
}

-- What a request is when a key is absent (same as hetslurm.request.language.Request).
M.DEFAULTS = {
  nodes = 1,
  gpus_per_node = 0,
  fpgas_per_node = 0,
  cores_per_node = 1,
  priority = "normal",
  energy = "normal",
  no_requeue = false,
}

-- Keys in documentation order. `flag` keys take no value.
M.KEYS = {
  "nodes", "gpus", "gpus-per-node", "gpu-type", "min-gpu-mem", "fpga", "cores", "mem",
  "locality", "switch-wait", "class", "priority", "energy", "no-requeue", "on-idle",
  "wait-for",
}
local FLAGS = { ["no-requeue"] = true }

local LOCALITY_LEVELS = { "nvlink", "numa", "switch" }
local LOCALITY_STRENGTHS = { "required", "preferred" }
local PRIORITIES = { "high", "normal", "low" }
local ENERGIES = { "low", "normal" }
local ON_IDLE = { "notify", "requeue", "downgrade" }
-- hetslurm adds these as node features itself (hetslurm/site/names.py RESERVED_FEATURES).
local RESERVED_MODELS = { gpu = true, fpga = true, cpu = true, any = true }

-- Helpers ------------------------------------------------------------------------------------

-- A token as it may appear in a message: printable ASCII only, at most 40 bytes.
local function show(s)
  local out = string_gsub(s, "[^\32-\126]", "?")
  if #out > 40 then
    out = string_sub(out, 1, 37) .. "..."
  end
  return "'" .. out .. "'"
end

local function contains(list, value)
  for _, v in ipairs(list) do
    if v == value then
      return true
    end
  end
  return false
end

local function quoted_list(list)
  local parts = {}
  for i, v in ipairs(list) do
    parts[i] = v
  end
  return table_concat(parts, ", ")
end

-- Levenshtein distance of two short strings (callers cut them to 32 bytes).
local function distance(a, b)
  local la, lb = #a, #b
  local prev, cur = {}, {}
  for j = 0, lb do
    prev[j] = j
  end
  for i = 1, la do
    cur[0] = i
    local ca = string_byte(a, i)
    for j = 1, lb do
      local cost = (ca == string_byte(b, j)) and 0 or 1
      cur[j] = math_min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[lb]
end

-- The closest of `candidates` to `word`, if it is close enough to be a likely typo.
local function nearest(word, candidates)
  local w = string_sub(string_gsub(string_lower(word), "_", "-"), 1, 32)
  local best, best_d = nil, 3
  for _, c in ipairs(candidates) do
    local d = distance(w, c)
    if d < best_d then
      best, best_d = c, d
    end
  end
  if best and best_d <= math_min(2, math_floor(#best / 2)) then
    return best
  end
  return nil
end

local function did_you_mean(word, candidates)
  local hint = nearest(word, candidates)
  if hint then
    return " (did you mean '" .. hint .. "'?)"
  end
  return ""
end

-- A whole number written in decimal digits only, from lo to hi. Refuses what tonumber()
-- would accept but a count must not be: '0x10', '1.5', '1e3', ' 4', '+4', '-1', '4abc'.
local function whole(s, lo, hi)
  if #s <= 2 then
    -- The usual count: one or two digits, read as bytes (no pattern match, no tonumber).
    local a, b = string_byte(s, 1, 2)
    if not a or a < 48 or a > 57 or (b and (b < 48 or b > 57)) then
      return nil
    end
    local n = b and (a - 48) * 10 + (b - 48) or a - 48
    if n < lo or n > hi then
      return nil
    end
    return n
  end
  if not string_find(s, "^%d+$") then
    return nil
  end
  if #s <= 15 then
    -- Decimal digits only (checked above), so tonumber reads them exactly, leading zeros too.
    local n = tonumber(s)
    if n < lo or n > hi then
      return nil
    end
    return n
  end
  local digits = string_gsub(s, "^0+", "")
  if digits == "" then
    return (lo <= 0) and 0 or nil
  end
  -- 15 digits stay exact in a double; anything longer is above every bound anyway.
  if #digits > 15 then
    return nil
  end
  local n = tonumber(digits)
  if n < lo or n > hi then
    return nil
  end
  return n
end

local function bad_count(token, what, lo, hi)
  return string_format("%s: %s must be a whole number from %d to %d", show(token), what, lo, hi)
end

local MEM_UNITS = { [""] = 1, m = 1, g = 1024, t = 1048576 }

-- A size in MiB: digits with an optional K, M, G or T (either case; no unit = MiB, as
-- sbatch --mem). K must come to whole MiB.
-- Error messages are built only when they are returned: the accepted path allocates little.
local function size_expected(token, what)
  return string_format(
    "%s: %s must be a whole size from 1M to 64T, e.g. 16G, 512M or 16384 (MiB)",
    show(token), what)
end

local function mebibytes(token, s, what)
  local hi = M.LIMITS.mem_mib
  local num, unit = string_match(s, "^(%d+)([KkMmGgTt]?)$")
  if not num then
    return nil, size_expected(token, what)
  end
  unit = string_lower(unit)
  if unit == "k" then
    local kib = whole(num, 1, hi * 1024)
    if not kib then
      return nil, size_expected(token, what)
    end
    if kib % 1024 ~= 0 then
      return nil, string_format("%s: %s must be a whole number of MiB (a multiple of 1024K)",
        show(token), what)
    end
    return math_floor(kib / 1024) -- an integer under Lua 5.3+ too
  end
  local factor = MEM_UNITS[unit]
  local n = whole(num, 1, math_floor(hi / factor))
  if not n then
    return nil, size_expected(token, what)
  end
  return n * factor
end

-- A wait in seconds: 600, 30s, 10m, 1h, MM:SS or HH:MM:SS. Unlike Slurm's time strings a bare
-- number is seconds here, because "switch-wait" is a wait, not a time limit.
local WAIT_UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

local function wait_expected(token, what, most)
  return string_format(
    "%s: %s must be a wait of at most %s: 600 (seconds), 30s, 10m, 1h, "
    .. "10:00 or 00:10:00", show(token), what or "switch-wait", most or "one day")
end

local function seconds(token, s, hi, what, most)
  hi = hi or M.LIMITS.switch_wait_s
  local n = whole(s, 0, hi)
  if n then
    return n
  end
  local num, unit = string_match(s, "^(%d+)([smhd])$")
  if num then
    local v = whole(num, 0, math_floor(hi / WAIT_UNITS[unit]))
    if not v then
      return nil, wait_expected(token, what, most)
    end
    return v * WAIT_UNITS[unit]
  end
  -- HH:MM:SS, or MM:SS where the minutes may pass 59 (90:00 is an hour and a half).
  local h, m, sec = string_match(s, "^(%d%d?):(%d%d):(%d%d)$")
  local minutes_cap = 59
  if not h then
    h, minutes_cap = "0", 9999
    m, sec = string_match(s, "^(%d%d?%d?%d?):(%d%d)$")
  end
  if not m then
    return nil, wait_expected(token, what, most)
  end
  local hv, mv, sv = tonumber(h), tonumber(m), tonumber(sec)
  if sv > 59 or mv > minutes_cap then
    return nil, wait_expected(token, what, most)
  end
  local total = hv * 3600 + mv * 60 + sv
  if total > hi then
    return nil, wait_expected(token, what, most)
  end
  return total
end

-- One model name: the rule of hetslurm/site/names.py MODEL_RE (a Slurm gres type and a
-- node feature at once).
local function model_problem(token, name)
  if name == "" then
    return string_format("%s: an empty model name (check for a stray '|' or ':')", show(token))
  end
  if RESERVED_MODELS[name] then
    return string_format("%s: '%s' is not a model name", show(token), name)
  end
  if #name > 31 or not string_find(name, "^[a-z][a-z0-9_]*$") then
    return string_format(
      "%s: %s is not a model name: a lowercase letter, then lowercase letters, digits or '_' "
      .. "(at most 31), e.g. h100", show(token), show(name))
  end
  return nil
end

-- A ranked any-of list "m1|m2|...": distinct valid names, at most MAX_MODELS.
local function model_list(token, s)
  local models, seen, count = {}, {}, 0
  -- Appending "|" lets one pattern see every field, empty ones included.
  for name in string_gmatch(s .. "|", "([^|]*)|") do
    count = count + 1
    if count > M.MAX_MODELS then
      return nil, string_format("%s: at most %d models in one list", show(token), M.MAX_MODELS)
    end
    local problem = model_problem(token, name)
    if problem then
      return nil, problem
    end
    if seen[name] then
      return nil, string_format("%s: model '%s' is listed twice", show(token), name)
    end
    seen[name] = true
    models[count] = name
  end
  return models
end

-- Key handlers: handler(value, token, acc) returns true, or nil and a message. ---------------

local H = {}

H["nodes"] = function(v, token, acc)
  local n = whole(v, 1, M.LIMITS.nodes)
  if not n then
    return nil, bad_count(token, "nodes", 1, M.LIMITS.nodes)
  end
  acc.nodes = n
  return true
end

H["gpus"] = function(v, token, acc)
  local n = whole(v, 0, M.LIMITS.gpus_per_job)
  if not n then
    return nil, bad_count(token, "GPUs per job", 0, M.LIMITS.gpus_per_job)
  end
  acc.gpus_per_job = n
  return true
end

H["gpus-per-node"] = function(v, token, acc)
  local n = whole(v, 0, M.LIMITS.gpus_per_node)
  if not n then
    return nil, bad_count(token, "GPUs per node", 0, M.LIMITS.gpus_per_node)
  end
  acc.gpus_per_node = n
  return true
end

H["gpu-type"] = function(v, token, acc)
  if v == "any" then
    acc.gpu_models = {}
    return true
  end
  local models, msg = model_list(token, v)
  if not models then
    return nil, msg .. " (write gpu-type=h100|a100 in order of preference, or gpu-type=any)"
  end
  acc.gpu_models = models
  return true
end

H["min-gpu-mem"] = function(v, token, acc)
  local mib, msg = mebibytes(token, v, "min-gpu-mem")
  if not mib then
    return nil, msg
  end
  acc.min_gpu_mem_mib = mib
  return true
end

local function fpga_expected(token)
  return string_format(
    "%s: write fpga=N (0 to %d per node), fpga=model, fpga=model:N or fpga=m1|m2:N",
    show(token), M.LIMITS.fpgas_per_node)
end

-- fpga=N, fpga=model, fpga=model:N or fpga=m1|m2:N (per node).
H["fpga"] = function(v, token, acc)
  local hi = M.LIMITS.fpgas_per_node
  -- A count unless it starts like a model list (a letter, or a stray ':' or '|').
  if not string_find(v, "^[%a:|]") then
    local n = whole(v, 0, hi)
    if not n then
      return nil, fpga_expected(token)
    end
    acc.fpgas_per_node = n
    acc.fpga_models = {}
    return true
  end
  local list, count = string_match(v, "^([^:]*):(.*)$")
  if not list then
    list, count = v, "1"
  end
  local n = whole(count, 1, hi)
  if not n then
    return nil, fpga_expected(token)
  end
  local models, msg = model_list(token, list)
  if not models then
    return nil, msg
  end
  acc.fpgas_per_node = n
  acc.fpga_models = models
  return true
end

H["cores"] = function(v, token, acc)
  local n = whole(v, 1, M.LIMITS.cores_per_node)
  if not n then
    return nil, bad_count(token, "cores per node", 1, M.LIMITS.cores_per_node)
  end
  acc.cores_per_node = n
  return true
end

H["mem"] = function(v, token, acc)
  local mib, msg = mebibytes(token, v, "mem (per node)")
  if not mib then
    return nil, msg
  end
  acc.mem_per_node_mib = mib
  return true
end

-- locality=item[,item...], item = level[:required|:preferred]; a bare level is preferred.
H["locality"] = function(v, token, acc)
  local loc = {}
  local seen_any = false
  for item in string_gmatch(v .. ",", "([^,]*),") do
    local level, strength = string_match(item, "^([^:]*):(.*)$")
    if not level then
      level, strength = item, "preferred"
    end
    if not contains(LOCALITY_LEVELS, level) then
      return nil, string_format("%s: unknown locality level %s%s; levels: %s", show(token),
        show(level), did_you_mean(level, LOCALITY_LEVELS), quoted_list(LOCALITY_LEVELS))
    end
    if not contains(LOCALITY_STRENGTHS, strength) then
      return nil, string_format("%s: locality %s must be %s:required or %s:preferred%s",
        show(token), level, level, level, did_you_mean(strength, LOCALITY_STRENGTHS))
    end
    if loc[level] then
      return nil, string_format("%s: locality level '%s' is given twice", show(token), level)
    end
    loc[level] = strength
    seen_any = true
  end
  if not seen_any then
    return nil, string_format("%s: name at least one of %s", show(token),
      quoted_list(LOCALITY_LEVELS))
  end
  acc.locality = loc
  return true
end

H["switch-wait"] = function(v, token, acc)
  local s, msg = seconds(token, v)
  if not s then
    return nil, msg
  end
  acc.switch_wait_s = s
  return true
end

-- wait-for=first: wait for the first model of the job's ranked list instead of falling back
-- at once; wait-for=first,max=W: for at most W (rebalance's relax then widens the job).
H["wait-for"] = function(v, token, acc)
  if v == "first" then
    acc.wait_for = "first"
    return true
  end
  local w = string_match(v, "^first,max=(.+)$")
  if not w then
    return nil, string_format("%s: must be 'first' or 'first,max=WAIT' (e.g. first,max=30m): "
      .. "wait for the first GPU model of the job's list, at most WAIT", show(token))
  end
  local s, msg = seconds(token, w, M.LIMITS.wait_for_max_s, "max", "one week")
  if not s then
    return nil, msg
  end
  acc.wait_for = "first"
  acc.wait_for_max_s = s
  return true
end

H["class"] = function(v, token, acc)
  -- hetslurm/site/names.py IDENT_RE: class names appear unquoted in rendered config.
  if #v > 63 or not string_find(v, "^[A-Za-z][A-Za-z0-9_-]*$") then
    return nil, string_format(
      "%s: a class name starts with a letter and holds only letters, digits, '_' or '-' "
      .. "(at most 63); `hetslurm site show` lists the site's classes", show(token))
  end
  acc.workload_class = v
  return true
end

local function choice(field, allowed)
  return function(v, token, acc)
    if not contains(allowed, v) then
      return nil, string_format("%s: must be one of %s%s", show(token), quoted_list(allowed),
        did_you_mean(v, allowed))
    end
    acc[field] = v
    return true
  end
end

H["priority"] = choice("priority", PRIORITIES)
H["energy"] = choice("energy", ENERGIES)
H["on-idle"] = choice("on_idle", ON_IDLE)

H["no-requeue"] = function(_, _, acc)
  acc.no_requeue = true
  return true
end

-- Whole-request checks, after every token parsed. ----------------------------------------

-- An empty list or map shared by every request that has no models or locality: never written
-- (a request's own lists and maps are made by the key handlers).
local NONE = {}

-- acc starts as the defaults (new_request) and the handlers overwrite what the text names, so
-- it becomes the request itself: no copy.
local function finish(acc, tokens_of)
  local req = acc
  req.gpu_models = acc.gpu_models or NONE
  req.fpga_models = acc.fpga_models or NONE

  local nodes = req.nodes
  if acc.gpus_per_job and tokens_of["gpus-per-node"] then
    return nil, string_format(
      "%s and %s: give one of them (gpus= is per job and split evenly over nodes=, "
      .. "gpus-per-node= is per node)", show(tokens_of["gpus"]), show(tokens_of["gpus-per-node"]))
  end
  if acc.gpus_per_job then
    if acc.gpus_per_job % nodes ~= 0 then
      return nil, string_format(
        "%s: %d GPUs cannot be split evenly over nodes=%d; use a multiple of %d, or "
        .. "gpus-per-node=", show(tokens_of["gpus"]), acc.gpus_per_job, nodes, nodes)
    end
    req.gpus_per_node = math_floor(acc.gpus_per_job / nodes) -- an integer under Lua 5.3+
    if req.gpus_per_node > M.LIMITS.gpus_per_node then
      return nil, string_format(
        "%s: %d GPUs per node over nodes=%d; at most %d per node, so ask for more nodes",
        show(tokens_of["gpus"]), req.gpus_per_node, nodes, M.LIMITS.gpus_per_node)
    end
  elseif req.gpus_per_node * nodes > M.LIMITS.gpus_per_job then
    return nil, string_format("%s with nodes=%d: at most %d GPUs per job",
      show(tokens_of["gpus-per-node"]), nodes, M.LIMITS.gpus_per_job)
  end

  if req.gpus_per_node == 0 then
    local needs_gpus = { "gpu-type", "min-gpu-mem", "wait-for" }
    for _, key in ipairs(needs_gpus) do
      if tokens_of[key] then
        return nil, string_format("%s needs GPUs: add gpus=N or gpus-per-node=N",
          show(tokens_of[key]))
      end
    end
    if req.locality and req.locality.nvlink then
      return nil, string_format("%s: nvlink needs GPUs: add gpus=N or gpus-per-node=N",
        show(tokens_of["locality"]))
    end
  end

  if acc.switch_wait_s then
    if not (req.locality and req.locality.switch) then
      return nil, string_format(
        "%s needs locality=switch (the wait is how long Slurm may hold the job for one switch)",
        show(tokens_of["switch-wait"]))
    end
    req.locality.switch_wait_s = acc.switch_wait_s
  end
  req.switch_wait_s = nil  -- lives in req.locality
  req.locality = req.locality or NONE

  if req.no_requeue and req.on_idle == "requeue" then
    return nil, string_format("%s contradicts 'no-requeue': choose on-idle=notify or downgrade",
      show(tokens_of["on-idle"]))
  end
  return req
end

-- The parser. --------------------------------------------------------------------------------

-- A request holding the defaults (M.DEFAULTS), made by a table constructor that also sizes it
-- for the keys a request usually gets (no rehash while it fills up; inside slurmctld every
-- allocation and rehash is paid per submission). The nil fields only reserve room.
local D = M.DEFAULTS
local D_NODES, D_GPUS, D_FPGAS, D_CORES = D.nodes, D.gpus_per_node, D.fpgas_per_node,
  D.cores_per_node
local D_PRIORITY, D_ENERGY, D_NO_REQUEUE = D.priority, D.energy, D.no_requeue

local function new_request()
  return {
    nodes = D_NODES, gpus_per_node = D_GPUS, fpgas_per_node = D_FPGAS, cores_per_node = D_CORES,
    priority = D_PRIORITY, energy = D_ENERGY, no_requeue = D_NO_REQUEUE,
    gpu_models = nil, fpga_models = nil, locality = nil, given = nil, tokens = nil,
    workload_class = nil, gpus_per_job = nil, on_idle = nil, min_gpu_mem_mib = nil,
  } -- 16 fields: 16 slots; a request naming mem=, switch-wait= or wait-for= grows it once
end

-- parse(text) -> request table, or nil and a message. Never raises for any string input.
-- The table's fields are named as hetslurm.request.language.Request's; `given` lists the
-- keys the text named, in order, so a caller can tell a default from an explicit value.
function M.parse(text)
  if type(text) ~= "string" then
    return nil, "a request must be text"
  end
  if #text > M.MAX_BYTES then
    return nil, string_format("the request is %d bytes; at most %d (the size of a Slurm comment)",
      #text, M.MAX_BYTES)
  end
  -- Words are counted by position first (no string made), so the bound is checked before any
  -- word is read. A text of at most 2 * MAX_TOKENS bytes cannot hold more words than that.
  local words, pos = 0, 1
  while #text > 2 * M.MAX_TOKENS do
    local _, e = string_find(text, "%S+", pos)
    if not e then
      break
    end
    if words == M.MAX_TOKENS then
      return nil, string_format(
        "the request has more than %d words; each key may appear once (%d keys exist)",
        M.MAX_TOKENS, #M.KEYS)
    end
    words = words + 1
    pos = e + 1
  end
  -- Sized for four keys from the start (most requests name two or three).
  local acc = new_request()
  local tokens_of = { k1 = nil, k2 = nil, k3 = nil, k4 = nil } -- the nils only make room
  local given = { nil, nil, nil, nil }
  for token in string_gmatch(text, "%S+") do
    local eq = string_find(token, "=", 1, true)
    local key, value = token, nil
    if eq then
      key, value = string_sub(token, 1, eq - 1), string_sub(token, eq + 1)
    end
    local handler = H[key]
    if key == "" then
      return nil, string_format("%s: a key is missing before '='; keys: %s", show(token),
        quoted_list(M.KEYS))
    end
    if not handler then
      return nil, string_format("%s: unknown key %s%s; keys: %s", show(token), show(key),
        did_you_mean(key, M.KEYS), quoted_list(M.KEYS))
    end
    if tokens_of[key] then
      return nil, string_format("%s: key '%s' is given twice (first as %s)", show(token), key,
        show(tokens_of[key]))
    end
    if FLAGS[key] then
      if value then
        return nil, string_format("%s: '%s' is a flag; write it without '='", show(token), key)
      end
    elseif value == nil or value == "" then
      return nil, string_format("%s: '%s' needs a value, e.g. %s=...", show(token), key, key)
    end
    local ok, msg = handler(value, token, acc)
    if not ok then
      return nil, msg
    end
    tokens_of[key] = token
    given[#given + 1] = key
  end
  local req, msg = finish(acc, tokens_of)
  if not req then
    return nil, msg
  end
  req.given = given
  -- key -> the word that gave it: the set of keys named, for callers (the hook) that ask
  -- "was this key given?" often.
  req.tokens = tokens_of
  return req
end

return M
