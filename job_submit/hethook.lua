-- hethook.lua: hetslurm's job_submit decision, implemented once.
--
-- `hetslurm hook install` embeds this module, hetreq.lua (the request grammar) and the rules
-- rendered from the site file into one job_submit.lua (job_submit/job_submit.lua.in), the
-- only file slurmctld's job_submit/lua plugin reloads. `hetslurm explain` runs that same
-- rendered file through lupa's Lua 5.1 with a strict stand-in for `slurm` and the job.
--
-- Contract (docs/hook.md):
--   * decide(job, rules, hetreq, slurm) reads the job description and returns a decision
--     table; it never writes to the job. apply(job, decision) writes the staged fields and
--     nothing else, so an error while deciding leaves the job untouched (the caller fails
--     open). No I/O, no globals read after load or written ever, no state kept between calls.
--   * user mistakes give { action = "reject", code = <Slurm errno>, message = <one line> };
--     the message is printable ASCII and names the #HET line (or the --comment) it came from.
--   * Lua 5.1: counts written to the job are integers below 2^31, so they print as digits.

local string_byte = string.byte
local string_find = string.find
local string_format = string.format
local string_gmatch = string.gmatch
local string_gsub = string.gsub
local string_match = string.match
local string_sub = string.sub
local table_concat = table.concat
local table_sort = table.sort
local math_floor = math.floor
local tostring = tostring
local tonumber = tonumber
local pcall = pcall
local select = select
local type = type
local pairs = pairs
local ipairs = ipairs

local M = {}

M.VERSION = 1

-- Slurm's "no value" sentinels as the 22.05 plugin hands them over (slurm.h).
local NO_VAL16 = 65534
local NO_VAL = 4294967294
-- Slurm refuses a batch script above max_script_size (4 MB by default) before the hook runs;
-- the hook never reads more of the script than this even if a site raised the limit.
M.MAX_SCRIPT_BYTES = 4194304
-- A request has at most 32 words (hetreq.MAX_TOKENS); more #HET lines than this is a mistake.
M.MAX_DIRECTIVE_LINES = 64
M.PREFIX = "#HET"
M.COMMENT_PREFIX = "het:"

-- Error codes. The 22.05 plugin exports only a few ESLURM_* names in the `slurm` table
-- (ESLURM_ACCESS_DENIED, ESLURM_INVALID_NODE_COUNT, ...); the others are their values in
-- 22.05's slurm/slurm_errno.h, which sbatch turns into the familiar message.
-- Built once per `slurm` table (the plugin's constants; no job's data is kept between calls).
local CODES, CODES_FOR = nil, nil
local function codes(slurm)
  if CODES_FOR == slurm and CODES then
    return CODES
  end
  CODES = {
    generic = slurm.ERROR or -1,
    gres = slurm.ESLURM_INVALID_GRES or 2072,
    feature = slurm.ESLURM_INVALID_FEATURE or 2029,
    nodes = slurm.ESLURM_INVALID_NODE_COUNT or 2006,
    access = slurm.ESLURM_ACCESS_DENIED or 2002,
    config = slurm.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE or 2014,
    qos = slurm.ESLURM_INVALID_QOS or 2066,
  }
  CODES_FOR = slurm
  return CODES
end
M.codes = codes

-- Which error family a key's mistakes belong to.
local KEY_CODE = {
  nodes = "nodes", gpus = "gres", ["gpus-per-node"] = "gres", ["gpu-type"] = "gres",
  ["min-gpu-mem"] = "gres", fpga = "gres", cores = "config", mem = "config",
  locality = "config", ["switch-wait"] = "config", class = "feature", priority = "qos",
}

-- Helpers ------------------------------------------------------------------------------------

local function printable(s, limit)
  local out = s
  if string_find(s, "[^\32-\126]") then
    out = string_gsub(s, "[^\32-\126]", "?")
  end
  if #out > limit then
    out = string_sub(out, 1, limit - 3) .. "..."
  end
  return out
end

local function contains(list, value)
  for _, v in ipairs(list) do
    if v == value then
      return true
    end
  end
  return false
end

-- Every list joined here holds strings (model, class and field names).
local function join(list, sep)
  return table_concat(list, sep)
end

local function is_set16(v)
  return type(v) == "number" and v ~= NO_VAL16 and v < NO_VAL16
end

local function is_set32(v)
  return type(v) == "number" and v < NO_VAL
end

local function nonempty(s)
  return type(s) == "string" and s ~= ""
end

-- Closest name by edit distance, for "did you mean" (inputs cut to 32 bytes).
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
      local v = prev[j] + 1
      if cur[j - 1] + 1 < v then v = cur[j - 1] + 1 end
      if prev[j - 1] + cost < v then v = prev[j - 1] + cost end
      cur[j] = v
    end
    prev, cur = cur, prev
  end
  return prev[lb]
end

local function did_you_mean(word, candidates)
  local w = string_sub(word, 1, 32)
  local best, best_d = nil, 3
  for _, c in ipairs(candidates) do
    local d = distance(w, c)
    if d < best_d then
      best, best_d = c, d
    end
  end
  if best and best_d <= math_floor(#best / 2) then
    return " (did you mean '" .. best .. "'?)"
  end
  return ""
end

-- Reading the request --------------------------------------------------------------------------

-- The #HET lines of a batch script's header: like #SBATCH, scanning stops at the first line
-- that is neither blank nor a comment (first non-blank character '#'). A directive line is
-- "#HET" at column 0 followed by a blank or the end of the line.
-- Returns lines = { {n = line number, text = words after #HET}, ... }, or nil and a message.
function M.script_directives(script)
  local lines = {}
  local limit = #script
  if limit > M.MAX_SCRIPT_BYTES then
    limit = M.MAX_SCRIPT_BYTES
  end
  local pos, n, bytes = 1, 0, 0
  local in_later_component = nil
  -- Heterogeneous-job separators are rare: look for one only if the words occur at all.
  local may_separate = string_find(script, "hetjob", 1, true) or
    string_find(script, "packjob", 1, true)
  while pos <= limit do
    n = n + 1
    local nl = string_find(script, "\n", pos, true)
    local stop = (nl and nl <= limit) and nl - 1 or limit
    -- Bytes, not substrings: no allocation per line (100,000-line headers stay fast).
    local c, c1, c2, c3, after = string_byte(script, pos, pos + 4)
    if c ~= 35 then -- not '#' in column 0: blank, an indented comment, or the header's end
      local first = string_find(script, "[^ \t\r\f\v]", pos)
      if first and first <= stop and string_byte(script, first) ~= 35 then
        break
      end
    elseif c1 == 72 and c2 == 69 and c3 == 84 then -- "#HET"
      if pos + 4 > stop or after == 32 or after == 9 or after == 13 then
        if in_later_component then
          return nil, string_format("#HET line %d: #HET lines after '#SBATCH hetjob' (line %d) "
            .. "would apply to the first component; give a later component its request with "
            .. "#SBATCH --comment=\"het: ...\"", n, in_later_component)
        end
        if #lines == M.MAX_DIRECTIVE_LINES then
          return nil, string_format("#HET line %d: more than %d #HET lines; a request has at "
            .. "most 32 words, so put several on one line", n, M.MAX_DIRECTIVE_LINES)
        end
        -- Read at most a little past the request bound: the grammar refuses longer ones.
        local last = stop
        if last - (pos + 4) > 1100 then
          last = pos + 4 + 1100
        end
        local text = string_sub(script, pos + 4, last)
        bytes = bytes + #text
        if bytes > 1100 then
          return nil, string_format("#HET line %d: the #HET lines hold more than 1024 bytes "
            .. "of request (the size of a Slurm comment); shorten them", n)
        end
        lines[#lines + 1] = { n = n, text = text }
      end
    elseif may_separate and c1 == 83 and c2 == 66 then -- "#SB"
      local word = string_match(string_sub(script, pos, pos + 40), "^#SBATCH[ \t]+(%a+)")
      if word == "hetjob" or word == "packjob" then
        in_later_component = n
      end
    end
    if not nl then
      break
    end
    pos = nl + 1
  end
  return lines
end

-- Where a request comes from: the script's #HET lines or a "het: ..." comment (srun, salloc,
-- or any submission). Returns source ("script" | "comment" | nil), the text, the lines, or
-- nil, nil, nil, message.
local function request_text(job)
  local lines, err
  local script = job.script
  if type(script) == "string" then
    lines, err = M.script_directives(script)
    if not lines then
      return nil, nil, nil, err
    end
  else
    lines = {}
  end
  local comment = job.comment
  local from_comment = type(comment) == "string"
    and string_sub(comment, 1, #M.COMMENT_PREFIX) == M.COMMENT_PREFIX
  if #lines > 0 and from_comment then
    return nil, nil, nil, string_format("#HET line %d: the job has #HET lines and a "
      .. "--comment starting with 'het:'; give the request once", lines[1].n)
  end
  if from_comment then
    local text = string_sub(comment, #M.COMMENT_PREFIX + 1)
    return "comment", text, { { n = 0, text = text } }
  end
  if #lines == 1 then
    return "script", lines[1].text, lines
  end
  if #lines > 0 then
    local texts = {}
    for i, l in ipairs(lines) do
      texts[i] = l.text
    end
    return "script", table_concat(texts, " "), lines
  end
  return nil
end

local function where(source, n)
  if source == "comment" then
    return "--comment het:"
  end
  return "#HET line " .. n
end

-- The line an error belongs to: the first prefix of lines that fails with the same message.
local function locate_error(hetreq, lines, message)
  if #lines == 1 then
    return lines[1].n
  end
  local acc = {}
  for i, l in ipairs(lines) do
    acc[i] = l.text
    local _, msg = hetreq.parse(table_concat(acc, " "))
    if msg == message then
      return l.n
    end
  end
  return lines[#lines].n
end

-- The line a key was given on.
local function line_of_key(lines, key)
  for _, l in ipairs(lines) do
    for token in string_gmatch(l.text, "%S+") do
      if token == key or string_sub(token, 1, #key + 1) == key .. "=" then
        return l.n
      end
    end
  end
  return lines[1] and lines[1].n or 0
end

-- Explicit device requests -------------------------------------------------------------------

-- The job's own GPU/FPGA requests, from the four fields Slurm 22.05 puts them in:
-- --gres -> tres_per_node, --gpus -> tres_per_job, --gpus-per-task -> tres_per_task,
-- --gpus-per-socket -> tres_per_socket. Entries look like "gres:gpu:2", "gres:gpu:a100:2".
local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }
M.TRES_FIELDS = TRES_FIELDS

local function explicit_devices(job, kind, tres)
  for _, field in ipairs(TRES_FIELDS) do
    local value
    if tres then
      value = tres[field]
    else
      value = job[field]
    end
    if nonempty(value) then
      local index = 0
      for entry in string_gmatch(value, "[^,]+") do
        index = index + 1
        local rest = string_match(entry, "^gres[:/]" .. kind .. "(.*)$")
        if rest and (rest == "" or string_sub(rest, 1, 1) == ":") then
          local model, count = nil, nil
          local parts = {}
          for p in string_gmatch(rest, "[^:]+") do
            parts[#parts + 1] = p
          end
          if #parts >= 1 and string_find(parts[#parts], "^%d+$") then
            count = tonumber(parts[#parts])
            parts[#parts] = nil
          end
          if #parts >= 1 then
            model = parts[1]
          end
          return { field = field, value = value, entry = entry, index = index, model = model,
                   count = count, option = field }
        end
      end
    end
  end
  return nil
end
M.explicit_devices = explicit_devices

local OPTION_OF = {
  tres_per_node = "--gres", tres_per_job = "--gpus", tres_per_task = "--gpus-per-task",
  tres_per_socket = "--gpus-per-socket",
}

-- Replace entry number `index` of a comma list.
local function replace_entry(value, index, new)
  local out, i = {}, 0
  for entry in string_gmatch(value, "[^,]+") do
    i = i + 1
    out[i] = (i == index) and new or entry
  end
  return table_concat(out, ",")
end

-- A plain AND of features (no '|', brackets, counts or '*'): safe to extend with '&'.
local function and_only(expr)
  return string_find(expr, "^[%w_%-.&]+$") ~= nil
end

-- Policy -------------------------------------------------------------------------------------

local function model_check(models, site_models, kind, key, site)
  for _, m in ipairs(models) do
    if not contains(site_models, m) then
      local offered = #site_models > 0 and join(site_models, ", ") or "none"
      return string_format("%s: %s model '%s' is not in site '%s'%s; its %s models: %s", key,
        kind, m, site, did_you_mean(m, site_models), kind, offered)
    end
  end
  return nil
end

local function kind_models(devices, site_models)
  local out = {}
  for _, d in ipairs(devices) do
    if contains(site_models, d) then
      out[#out + 1] = d
    end
  end
  return out
end

-- Canonical request text for the record: only validated words, so it holds no quote, brace or
-- byte a reader of the record could trip on.
local LOCALITY_LEVELS = { "nvlink", "numa", "switch" }

local function canonical(req, no_gpu_count)
  local w = {}
  if req.nodes ~= 1 then w[#w + 1] = "nodes=" .. req.nodes end
  if no_gpu_count then
    -- the count came from the job's own --gres/--gpus, not from the request
  elseif req.gpus_per_job then
    w[#w + 1] = "gpus=" .. req.gpus_per_job
  elseif req.gpus_per_node > 0 then
    w[#w + 1] = "gpus-per-node=" .. req.gpus_per_node
  end
  if #req.gpu_models > 0 then w[#w + 1] = "gpu-type=" .. join(req.gpu_models, "|") end
  if req.min_gpu_mem_mib then w[#w + 1] = "min-gpu-mem=" .. req.min_gpu_mem_mib .. "M" end
  if #req.fpga_models > 0 then
    w[#w + 1] = "fpga=" .. join(req.fpga_models, "|") .. ":" .. req.fpgas_per_node
  elseif req.fpgas_per_node > 0 then
    w[#w + 1] = "fpga=" .. req.fpgas_per_node
  end
  if req.cores_per_node ~= 1 then w[#w + 1] = "cores=" .. req.cores_per_node end
  if req.mem_per_node_mib then w[#w + 1] = "mem=" .. req.mem_per_node_mib .. "M" end
  local loc = {}
  for _, level in ipairs(LOCALITY_LEVELS) do
    if req.locality[level] then loc[#loc + 1] = level .. ":" .. req.locality[level] end
  end
  if #loc > 0 then w[#w + 1] = "locality=" .. table_concat(loc, ",") end
  if req.locality.switch_wait_s then w[#w + 1] = "switch-wait=" .. req.locality.switch_wait_s end
  if req.workload_class then w[#w + 1] = "class=" .. req.workload_class end
  if req.priority ~= "normal" then w[#w + 1] = "priority=" .. req.priority end
  if req.energy ~= "normal" then w[#w + 1] = "energy=" .. req.energy end
  if req.no_requeue then w[#w + 1] = "no-requeue" end
  if req.on_idle then w[#w + 1] = "on-idle=" .. req.on_idle end
  return table_concat(w, " ")
end
M.canonical = canonical

-- The decision record: one namespaced segment, `<key>:{...}`, a flat JSON object whose
-- values hold no brace or quote. Fields are dropped from the end until it fits the bound.
local RECORD_ORDER = { "v", "rules", "mode", "src", "outcome", "class", "gpu", "fpga", "set",
                       "kept", "on_idle", "energy", "req" }

-- Values that may come from the job's own options (a GPU or FPGA type named in --gres) are
-- cleaned; the others are built by the hook from the grammar's checked tokens and the site's
-- checked names, so they hold only these characters already.
local RECORD_UNSAFE = "[^%w _%-.|,:=@]"
local RECORD_FOREIGN = { gpu = true, fpga = true }

-- The values come as arguments in RECORD_ORDER (no table of them is built per call).
local function record_segment(key, max_bytes, ...)
  local parts, n = {}, 0
  for i = 1, #RECORD_ORDER do
    local name = RECORD_ORDER[i]
    local v = (select(i, ...))
    if v ~= nil and v ~= "" then
      n = n + 1
      if type(v) == "number" then
        parts[n] = '"' .. name .. '":' .. v
      else
        local safe = tostring(v)
        if RECORD_FOREIGN[name] and string_find(safe, RECORD_UNSAFE) then
          safe = string_gsub(safe, RECORD_UNSAFE, "?")
        end
        parts[n] = '"' .. name .. '":"' .. safe .. '"'
      end
    end
  end
  -- Fields are dropped from the end until the segment fits (the first three always stay).
  local seg = key .. ":{" .. table_concat(parts, ",") .. "}"
  while #seg > max_bytes and n > 3 do
    parts[n] = nil
    n = n - 1
    seg = key .. ":{" .. table_concat(parts, ",") .. "}"
  end
  return seg
end

-- Find our segment in a field's text: start and end positions, or nil.
local function find_segment(text, key)
  local s = string_find(text, key .. ":{", 1, true)
  if not s then
    return nil
  end
  local e = string_find(text, "}", s, true)
  if not e then
    return nil
  end
  return s, e
end
M.find_segment = find_segment

-- The field's new text: our segment replaced or appended, other tools' text kept as it is.
local function merge_record(old, seg, key)
  if not nonempty(old) then
    return seg
  end
  local s, e = find_segment(old, key)
  if s then
    return string_sub(old, 1, s - 1) .. seg .. string_sub(old, e + 1)
  end
  return old .. " " .. seg
end
M.merge_record = merge_record

-- The decision ---------------------------------------------------------------------------------

local function reject(d, code, message)
  d.action = "reject"
  d.code = code
  d.message = printable(message, 400)
  return d
end

local function note(d, text)
  d.notes[#d.notes + 1] = printable(text, 300)
end

local function stage(d, field, value)
  d.writes[#d.writes + 1] = { field, value }
  d.written[field] = value
end

local function may_use_high(job, rules)
  local allowed = rules.high_priority
  if allowed.anyone then
    return true
  end
  local user = job.user_name
  if type(user) == "string" and allowed.users[user] then
    return true
  end
  local account = job.account
  if not nonempty(account) then
    account = job.default_account
  end
  return type(account) == "string" and allowed.accounts[account] == true
end

-- decide(job, rules, hetreq, slurm) -> decision table (see docs/hook.md):
--   action   "none" (no request), "rewrite" or "reject"
--   writes   { {field, value}, ... } in write order; notes: lines for the user
--   code, message (reject); record (the segment written to rules.record.field); log (one line)
function M.decide(job, rules, hetreq, slurm)
  local C = codes(slurm)
  local d = { action = "none", writes = {}, written = {}, notes = {}, kept = {} }
  local source, text, lines, err = request_text(job)
  if err then
    return reject(d, C.generic, err)
  end
  if not source then
    return d
  end
  d.source = source

  -- Each job_desc read is a C call that walks the plugin's list of names: read these once.
  local tres = {}
  for _, field in ipairs(TRES_FIELDS) do
    tres[field] = job[field]
  end
  local gpu_explicit = explicit_devices(job, "gpu", tres)
  local fpga_explicit = explicit_devices(job, "fpga", tres)

  local req, msg = hetreq.parse(text)
  local synthetic_gpus = false
  if not req and gpu_explicit and (gpu_explicit.count or 1) > 0 then
    -- gpu-type= / min-gpu-mem= need GPUs; the job's own --gres/--gpus gives them.
    local retry = hetreq.parse(text .. " gpus-per-node=1")
    if retry then
      req, synthetic_gpus = retry, true
    end
  end
  if not req then
    local n = locate_error(hetreq, lines, msg)
    local key = string_match(msg, "^'([%a-]+)[=']")
    local family = key and KEY_CODE[key] or "generic"
    return reject(d, C[family], where(source, n) .. ": " .. msg)
  end
  d.request = canonical(req, synthetic_gpus)
  local given = {}
  for _, k in ipairs(req.given) do
    given[k] = true
  end
  if synthetic_gpus then
    given["gpus-per-node"] = nil
  end
  local function at(key)
    return where(source, line_of_key(lines, key))
  end

  -- Models named in the request exist on this site (checked first, as resolve() does).
  if given["gpu-type"] and #req.gpu_models > 0 then
    local bad = model_check(req.gpu_models, rules.gpu_models, "GPU", "gpu-type", rules.site)
    if bad then
      return reject(d, C.gres, at("gpu-type") .. ": " .. bad)
    end
  end
  if #req.fpga_models > 0 then
    local bad = model_check(req.fpga_models, rules.fpga_models, "FPGA", "fpga", rules.site)
    if bad then
      return reject(d, C.gres, at("fpga") .. ": " .. bad)
    end
  end

  -- class= -----------------------------------------------------------------------------
  local cls
  if req.workload_class then
    cls = rules.classes[req.workload_class]
    if not cls then
      return reject(d, C.feature, string_format(
        "%s: class=%s: site '%s' has no such class%s; classes: %s", at("class"),
        req.workload_class, rules.site, did_you_mean(req.workload_class, rules.class_names),
        join(rules.class_names, ", ")))
    end
    d.class = req.workload_class
  end

  -- GPUs -------------------------------------------------------------------------------
  local gpu_count_given = given["gpus"] or given["gpus-per-node"]
  local gpu_job, gpu_count, gpu_models, gpu_typed_explicit
  if gpu_explicit then
    gpu_job = (gpu_explicit.count == nil) or gpu_explicit.count > 0
    if gpu_count_given then
      note(d, string_format("%s: gpus ignored: the job asks for GPUs with %s (%s)",
        at(given["gpus"] and "gpus" or "gpus-per-node"), OPTION_OF[gpu_explicit.field],
        gpu_explicit.entry))
      d.kept[#d.kept + 1] = gpu_explicit.field
    end
    if gpu_explicit.model then
      gpu_typed_explicit = true
      if given["gpu-type"] then
        note(d, string_format("%s: gpu-type ignored: the job names GPU type '%s' with %s",
          at("gpu-type"), gpu_explicit.model, OPTION_OF[gpu_explicit.field]))
        d.kept[#d.kept + 1] = gpu_explicit.field
      end
      gpu_models = { gpu_explicit.model }
    end
  else
    gpu_count = req.gpus_per_node
    gpu_job = gpu_count > 0
  end

  if cls and cls.cpu_only then
    if gpu_job or req.fpgas_per_node > 0 or (fpga_explicit and (fpga_explicit.count or 1) > 0) then
      return reject(d, C.config, string_format(
        "%s: class=%s runs on CPU-only nodes, but the job asks for GPUs or FPGAs; drop them or "
        .. "choose another class (%s)", at("class"), req.workload_class,
        join(rules.class_names, ", ")))
    end
  end

  if gpu_job and #rules.gpu_models == 0 then
    return reject(d, C.gres, string_format("%s: the job asks for GPUs; site '%s' has none",
      at(given["gpus"] and "gpus" or "gpus-per-node"), rules.site))
  end

  if gpu_job and not gpu_typed_explicit then
    if given["gpu-type"] and #req.gpu_models > 0 then
      local bad = model_check(req.gpu_models, rules.gpu_models, "GPU", "gpu-type", rules.site)
      if bad then
        return reject(d, C.gres, at("gpu-type") .. ": " .. bad)
      end
      gpu_models = req.gpu_models
    elseif given["gpu-type"] then
      gpu_models = {} -- gpu-type=any beats the class
    elseif cls then
      gpu_models = kind_models(cls.devices, rules.gpu_models)
    else
      gpu_models = {}
    end
  end

  if gpu_job and req.min_gpu_mem_mib then
    local floor = req.min_gpu_mem_mib
    local named = given["gpu-type"] and #req.gpu_models > 0 or gpu_typed_explicit
    local pool = (#(gpu_models or {}) > 0) and gpu_models or rules.gpu_models
    local keep = {}
    for _, m in ipairs(pool) do
      local mem = rules.gpu_mem[m]
      if mem and mem >= floor then
        keep[#keep + 1] = m
      elseif named then
        return reject(d, C.gres, string_format(
          "%s: min-gpu-mem=%dM: gpu-type %s has %s; drop it or lower min-gpu-mem",
          at("min-gpu-mem"), floor, m, mem and (mem .. " MiB") or "unknown memory"))
      end
    end
    if #keep == 0 then
      return reject(d, C.gres, string_format("%s: min-gpu-mem=%dM: no GPU model of site '%s' "
        .. "has that much memory", at("min-gpu-mem"), floor, rules.site))
    end
    gpu_models = keep
  end

  if gpu_job and req.energy == "low" and #rules.energy_low_models > 0 and not gpu_typed_explicit then
    local pool = (#gpu_models > 0) and gpu_models or rules.gpu_models
    local keep = {}
    for _, m in ipairs(pool) do
      if contains(rules.energy_low_models, m) then
        keep[#keep + 1] = m
      end
    end
    if #keep > 0 then
      gpu_models = keep
    else
      note(d, at("energy") .. ": energy=low: none of the acceptable GPU models is one of the "
        .. "site's low-energy models; the job keeps its models")
    end
  end

  -- FPGAs ------------------------------------------------------------------------------
  local fpga_job, fpga_models, fpga_typed_explicit = false, nil, false
  if fpga_explicit then
    fpga_job = (fpga_explicit.count == nil) or fpga_explicit.count > 0
    if given["fpga"] then
      note(d, string_format("%s: fpga ignored: the job asks for FPGAs with --gres (%s)",
        at("fpga"), fpga_explicit.entry))
      d.kept[#d.kept + 1] = fpga_explicit.field
    end
    fpga_typed_explicit = fpga_explicit.model ~= nil
  else
    fpga_job = req.fpgas_per_node > 0
    if fpga_job then
      if #rules.fpga_models == 0 then
        return reject(d, C.gres, string_format("%s: the job asks for FPGAs; site '%s' has none",
          at("fpga"), rules.site))
      end
      if #req.fpga_models > 0 then
        local bad = model_check(req.fpga_models, rules.fpga_models, "FPGA", "fpga", rules.site)
        if bad then
          return reject(d, C.gres, at("fpga") .. ": " .. bad)
        end
        fpga_models = req.fpga_models
      elseif cls then
        fpga_models = kind_models(cls.devices, rules.fpga_models)
      else
        fpga_models = {}
      end
    end
  end

  -- Mechanisms: gres and features ------------------------------------------------------
  local features = {}
  local gres_new = {}
  if gpu_job and not gpu_typed_explicit then
    if gpu_explicit then
      if #gpu_models == 1 then
        -- The job's own count, now typed: hard.
        local typed = string_format("gres:gpu:%s:%s", gpu_models[1],
          tostring(gpu_explicit.count or 1))
        stage(d, gpu_explicit.field, replace_entry(gpu_explicit.value, gpu_explicit.index, typed))
      elseif #gpu_models > 1 then
        features[#features + 1] = join(gpu_models, "|")
      end
    else
      if #gpu_models == 1 then
        gres_new[#gres_new + 1] = string_format("gres:gpu:%s:%d", gpu_models[1], gpu_count)
      else
        gres_new[#gres_new + 1] = string_format("gres:gpu:%d", gpu_count)
        if #gpu_models > 1 then
          features[#features + 1] = join(gpu_models, "|")
        end
      end
    end
  end
  if gpu_job then
    d.gpu = (gpu_models and #gpu_models > 0) and join(gpu_models, "|") or "any"
  end
  if fpga_job and not fpga_explicit then
    if #fpga_models == 1 then
      gres_new[#gres_new + 1] = string_format("gres:fpga:%s:%d", fpga_models[1], req.fpgas_per_node)
    else
      gres_new[#gres_new + 1] = string_format("gres:fpga:%d", req.fpgas_per_node)
      if #fpga_models > 1 then
        features[#features + 1] = join(fpga_models, "|")
      end
    end
  end
  if fpga_job then
    d.fpga = fpga_typed_explicit and fpga_explicit.model
      or ((fpga_models and #fpga_models > 0) and join(fpga_models, "|") or "any")
  end
  if cls and cls.cpu_only then
    features[#features + 1] = rules.cpu_feature
  end

  if #gres_new > 0 then
    local tpn = tres.tres_per_node
    if nonempty(tpn) and not d.written.tres_per_node then
      stage(d, "tres_per_node", tpn .. "," .. table_concat(gres_new, ","))
    elseif d.written.tres_per_node then
      stage(d, "tres_per_node", d.written.tres_per_node .. "," .. table_concat(gres_new, ","))
    else
      stage(d, "tres_per_node", table_concat(gres_new, ","))
    end
  end

  if #features > 1 then
    -- Two OR groups joined by '&' have no grouping Slurm 22.05 documents for this use.
    return reject(d, C.feature, string_format("%s: a GPU model list and an FPGA model list "
      .. "cannot both be enforced in one job on Slurm 22.05; name one model for one of them",
      at("gpu-type")))
  end
  if #features == 1 then
    local mine = features[1]
    local theirs = job.features
    if nonempty(theirs) then
      if string_find(mine, "|", 1, true) or not and_only(theirs) then
        note(d, string_format("%s: --constraint=%s kept; '%s' not added: add it to your "
          .. "--constraint or drop --constraint", at(cls and cls.cpu_only and "class" or "gpu-type"),
          printable(theirs, 60), mine))
        d.kept[#d.kept + 1] = "features"
      else
        stage(d, "features", theirs .. "&" .. mine)
      end
    else
      stage(d, "features", mine)
    end
  end

  -- Partition and QOS ------------------------------------------------------------------
  if cls and cls.partition then
    if nonempty(job.partition) then
      if job.partition ~= cls.partition then
        note(d, string_format("%s: --partition=%s kept over class=%s's partition %s",
          at("class"), printable(job.partition, 60), req.workload_class, cls.partition))
        d.kept[#d.kept + 1] = "partition"
      end
    else
      stage(d, "partition", cls.partition)
    end
  end

  if req.priority == "high" and not may_use_high(job, rules) then
    return reject(d, C.access, string_format("%s: priority=high is not allowed for user %s "
      .. "(site policy); use priority=normal or ask the site's admins", at("priority"),
      printable(tostring(job.user_name or job.user_id), 40)))
  end
  local qos = rules.priority_qos[req.priority]
  if not (given["priority"] and qos) then
    qos = cls and cls.qos or nil
  end
  if qos then
    if nonempty(job.qos) then
      if job.qos ~= qos then
        note(d, string_format("%s: --qos=%s kept over %s", at(given["priority"] and "priority"
          or "class"), printable(job.qos, 60), qos))
        d.kept[#d.kept + 1] = "qos"
      end
    else
      stage(d, "qos", qos)
    end
  end

  -- Nodes, cores, memory ---------------------------------------------------------------
  local nodes = req.nodes
  if given["nodes"] then
    if is_set32(job.min_nodes) then
      if job.min_nodes ~= req.nodes then
        note(d, string_format("%s: nodes ignored: the job asks for -N %d", at("nodes"),
          job.min_nodes))
        d.kept[#d.kept + 1] = "min_nodes"
      end
      nodes = job.min_nodes
    else
      stage(d, "min_nodes", req.nodes)
      stage(d, "max_nodes", req.nodes)
    end
  elseif is_set32(job.min_nodes) then
    nodes = job.min_nodes
  end

  if given["cores"] then
    if is_set16(job.pn_min_cpus) or is_set16(job.cpus_per_task)
        or is_set16(job.ntasks_per_node) or is_set32(job.num_tasks) then
      note(d, at("cores") .. ": cores ignored: the job sets its own task layout "
        .. "(--ntasks, --cpus-per-task, --ntasks-per-node or --mincpus)")
      d.kept[#d.kept + 1] = "pn_min_cpus"
    else
      stage(d, "pn_min_cpus", req.cores_per_node)
    end
  end

  if req.mem_per_node_mib then
    if job.min_mem_per_node ~= nil or job.min_mem_per_cpu ~= nil then
      note(d, at("mem") .. ": mem ignored: the job sets --mem or --mem-per-cpu")
      d.kept[#d.kept + 1] = "min_mem_per_node"
    else
      stage(d, "min_mem_per_node", req.mem_per_node_mib)
    end
  end

  -- Locality ---------------------------------------------------------------------------
  local loc = req.locality
  local has_devices = gpu_job or fpga_job
  local bind = (loc.nvlink == "required") or (loc.numa == "required" and has_devices)
  if bind then
    local flags = job.bitflags
    local enforce = slurm.GRES_ENFORCE_BIND or 16
    local disable = slurm.GRES_DISABLE_BIND or 524288
    if type(flags) ~= "number" then
      flags = 0
    end
    if math_floor(flags / disable) % 2 == 1 then
      note(d, at("locality") .. ": --gres-flags=disable-binding kept; locality not enforced")
      d.kept[#d.kept + 1] = "bitflags"
    elseif math_floor(flags / enforce) % 2 == 0 then
      stage(d, "bitflags", flags + enforce)
    end
  end
  if loc.numa == "required" and not has_devices then
    if is_set16(job.sockets_per_node) then
      note(d, at("locality") .. ": numa: the job's --sockets-per-node kept")
      d.kept[#d.kept + 1] = "sockets_per_node"
    else
      stage(d, "sockets_per_node", 1)
      if given["cores"] and not is_set16(job.cores_per_socket) then
        stage(d, "cores_per_socket", req.cores_per_node)
      end
    end
  end
  if loc.switch then
    if is_set32(job.req_switch) then
      note(d, at("locality") .. ": the job's --switches kept")
      d.kept[#d.kept + 1] = "req_switch"
    elseif nodes > 1 then
      stage(d, "req_switch", 1)
      stage(d, "wait4switch", loc.switch_wait_s or rules.switch_wait_default)
    else
      note(d, at("locality") .. ": switch: a one-node job is always under one switch")
    end
  end

  -- Requeue ----------------------------------------------------------------------------
  if req.no_requeue then
    if is_set16(job.requeue) and job.requeue ~= 0 then
      note(d, at("no-requeue") .. ": no-requeue ignored: the job asks for --requeue")
      d.kept[#d.kept + 1] = "requeue"
    elseif not is_set16(job.requeue) then
      stage(d, "requeue", 0)
    end
  end

  -- The record -------------------------------------------------------------------------
  d.action = "rewrite"
  local set = {}
  for _, w in ipairs(d.writes) do
    set[#set + 1] = w[1]
  end
  local rec = rules.record
  if rec.field ~= "none" then
    -- In RECORD_ORDER: v, rules, mode, src, outcome, class, gpu, fpga, set, kept, on_idle,
    -- energy, req.
    local seg = record_segment(rec.key, rec.max_bytes, M.VERSION, rules.digest, rules.mode,
      source, "rewrite", req.workload_class, d.gpu, d.fpga, join(set, ","), join(d.kept, ","),
      req.on_idle, req.energy ~= "normal" and req.energy or nil, d.request)
    local old = job[rec.field]
    local merged = merge_record(old, seg, rec.key)
    if #merged <= rec.max_field_bytes then
      stage(d, rec.field, merged)
      d.record = seg
    else
      d.record_dropped = true
    end
  end
  return d
end

-- One line for slurmctld.log (slurm.log_info).
function M.describe(d, job_label)
  local parts = { "hetslurm:", job_label, d.action }
  if d.action == "reject" then
    parts[#parts + 1] = "code=" .. tostring(d.code)
    parts[#parts + 1] = d.message
  else
    for _, w in ipairs(d.writes) do
      parts[#parts + 1] = w[1] .. "=" .. printable(tostring(w[2]), 200)
    end
    if #d.notes > 0 then
      parts[#parts + 1] = "kept=" .. join(d.kept, ",")
    end
  end
  return table_concat(parts, " ")
end

-- Write the staged fields. Types are checked first, so a setter cannot fail half-way for a
-- reason the hook could have seen; on any error the fields already written are restored.
local NUMERIC = {
  min_nodes = true, max_nodes = true, pn_min_cpus = true, min_mem_per_node = true,
  bitflags = true, sockets_per_node = true, cores_per_socket = true, req_switch = true,
  wait4switch = true, requeue = true,
}
M.NUMERIC = NUMERIC

-- Module-level functions, not closures, so a call allocates nothing for them.
local function write_staged(job, d)
  local writes = d.writes
  for i = 1, #writes do
    local w = writes[i]
    job[w[1]] = w[2]
    d.done = i
  end
end

local function write_one(job, field, value)
  job[field] = value
end

function M.apply(job, d)
  for _, w in ipairs(d.writes) do
    local want = NUMERIC[w[1]] and "number" or "string"
    if type(w[2]) ~= want then
      return false, "staged " .. w[1] .. " is a " .. type(w[2]) .. ", not a " .. want
    end
  end
  local old = {}
  for i, w in ipairs(d.writes) do
    old[i] = job[w[1]]
  end
  d.done = 0
  local ok, err = pcall(write_staged, job, d)
  if ok then
    return true
  end
  for i = d.done, 1, -1 do
    local field, value = d.writes[i][1], old[i]
    if value == nil then
      value = "" -- the 22.05 setters turn "" into "unset" on submission
    end
    pcall(write_one, job, field, value)
  end
  return false, err
end

-- slurm_job_modify: a field the hook wrote may not be changed by a user. The record names the
-- fields; the job record (job_rec) gives the current values.
local function record_fields(text, key)
  if not nonempty(text) then
    return nil
  end
  local s, e = find_segment(text, key)
  if not s then
    return nil
  end
  local seg = string_sub(text, s, e)
  local set = string_match(seg, '"set":"([^"]*)"')
  local list = {}
  if set then
    for f in string_gmatch(set, "[^,]+") do
      list[#list + 1] = f
    end
  end
  return list, seg
end
M.record_fields = record_fields

local ALIAS = { tres_per_node = "gres" }
-- uint16_t fields of job_desc_msg_t: NO_VAL16 means "not being changed".
local SIXTEEN = { requeue = true, pn_min_cpus = true, sockets_per_node = true,
                  cores_per_socket = true }

function M.check_modify(job, job_rec, modify_uid, rules, slurm)
  local C = codes(slurm)
  if rules.modify_exempt[modify_uid] then
    return nil
  end
  local comment = job.comment
  if type(comment) == "string" and string_sub(comment, 1, #M.COMMENT_PREFIX) == M.COMMENT_PREFIX
      and comment ~= job_rec.comment then
    return C.access, "hetslurm: het: requests are read at submission; resubmit the job to change it"
  end
  local rec = rules.record
  if rec.field == "none" then
    return nil
  end
  local fields, seg = record_fields(job_rec[rec.field], rec.key)
  if not fields then
    return nil
  end
  local new_rec = job[rec.field]
  if type(new_rec) == "string" and not string_find(new_rec, seg, 1, true) then
    return C.access, "hetslurm: the " .. rec.field .. " segment '" .. rec.key
      .. ":{...}' is the hook's decision record; keep it when you change the field"
  end
  for _, f in ipairs(fields) do
    -- bitflags arrive with every update (Slurm fills them in), so they cannot be compared.
    if f ~= rec.field and f ~= "bitflags" then
      local v = job[f]
      local changed
      if NUMERIC[f] then
        if SIXTEEN[f] then
          changed = is_set16(v)
        else
          changed = is_set32(v)
        end
        if changed then
          local cur = job_rec[f]
          if type(cur) == "number" and cur == v then
            changed = false
          end
        end
      else
        changed = type(v) == "string"
        if changed then
          local cur = job_rec[f]
          if cur == nil and ALIAS[f] then
            cur = job_rec[ALIAS[f]]
          end
          if cur == v then
            changed = false
          end
        end
      end
      if changed then
        return C.access, string_format("hetslurm: %s was set from this job's #HET request; "
          .. "resubmit with a new request to change it", f)
      end
    end
  end
  return nil
end

return M
