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
local type = type
local pairs = pairs
local ipairs = ipairs
local next = next

local M = {}

local VERSION = 1
M.VERSION = VERSION
local VERSION_TEXT = tostring(VERSION)

-- Numbers as text without sprintf (which tostring and string.format call): the counts a
-- request holds are small, so their texts are made once here. It saves instructions; inside
-- slurmctld, where the C library stays warm, it was not seen to matter (docs/hook.md).
local DECIMAL = {}
for i = 0, 256 do
  DECIMAL[i] = tostring(i)
end
local function decimal(n)
  local t = DECIMAL[n]
  if t then
    return t
  end
  -- Lua 5.3+ (RPM builds of the plugin link it) prints an integral float as "4.0".
  if n == math_floor(n) then
    return string_format("%d", n)
  end
  return tostring(n)
end

-- Any value as log text, numbers without a float's ".0" (see decimal).
local function as_text(v)
  if type(v) == "number" then
    return decimal(v)
  end
  return tostring(v)
end

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
-- Returns lines = { n1, text1, n2, text2, ... } (line number, words after #HET; one flat list,
-- not a table per line), or nil and a message. A script without #HET lines gets NO_LINES.
local NO_LINES = {} -- shared and never written

-- Adds #HET line n (the words after "#HET" on the line from pos to stop, read to at most a
-- little past the request bound: the grammar refuses longer ones) to the flat list. Returns
-- lines, count, bytes, or nil and a message when a bound is passed.
local function add_directive(lines, count, bytes, n, script, pos, stop)
  if count == M.MAX_DIRECTIVE_LINES then
    return nil, string_format("#HET line %d: more than %d #HET lines; a request has at most "
      .. "32 words, so put several on one line", n, M.MAX_DIRECTIVE_LINES)
  end
  local last = stop
  if last - (pos + 4) > 1100 then
    last = pos + 4 + 1100
  end
  local text = string_sub(script, pos + 4, last)
  bytes = bytes + #text
  if bytes > 1100 then
    return nil, string_format("#HET line %d: the #HET lines hold more than 1024 bytes of "
      .. "request (the size of a Slurm comment); shorten them", n)
  end
  if count == 0 then
    lines = { n, text }
  else
    lines[count * 2 + 1] = n
    lines[count * 2 + 2] = text
  end
  return lines, count + 1, bytes
end

-- The header is walked line by line (its line numbers are the messages'), but only while a
-- "#HET" line start remains ahead of the walk; where a script holds none, one plain search
-- (memchr in C) answers and no line is visited. The walk stops at the header's end, after the
-- last "#HET" line start, or at MAX_HEADER_LINES, so a 4 MB flood of short comment lines costs
-- a few milliseconds, not half a second (docs/security.md).
M.MAX_HEADER_LINES = 10000

-- The first "#HET" at the start of a line at or after line start `pos`, or nil.
local function next_het(script, pos)
  if pos == 1 then
    local a, b, c, d = string_byte(script, 1, 4)
    if a == 35 and b == 72 and c == 69 and d == 84 then
      return 1
    end
    pos = 2
  end
  local p = string_find(script, "\n#HET", pos - 1, true)
  return p and p + 1
end

function M.script_directives(script)
  local limit = #script
  if limit > M.MAX_SCRIPT_BYTES then
    limit = M.MAX_SCRIPT_BYTES
  end
  local het = next_het(script, 1)
  if not het or het > limit then
    return NO_LINES
  end
  local lines, count, bytes = NO_LINES, 0, 0
  local pos, n = 1, 0
  local in_later_component = nil
  while het and het <= limit do
    n = n + 1
    if n > M.MAX_HEADER_LINES then
      return nil, string_format("script line %d: more than %d header lines before a line "
        .. "starting with #HET; put the #HET lines at the top of the script", n,
        M.MAX_HEADER_LINES)
    end
    local nl = string_find(script, "\n", pos, true)
    local stop = (nl and nl <= limit) and nl - 1 or limit
    -- Bytes, not substrings: no allocation per line.
    local c, c1, c2 = string_byte(script, pos, pos + 2)
    if pos == het then -- "#HET" in column 0
      local after = string_byte(script, pos + 4)
      if pos + 4 > stop or after == 32 or after == 9 or after == 13 then
        if in_later_component then
          return nil, string_format("#HET line %d: #HET lines after '#SBATCH hetjob' (line %d) "
            .. "would apply to the first component; give a later component its request with "
            .. "#SBATCH --comment=\"het: ...\"", n, in_later_component)
        end
        local added, k, b = add_directive(lines, count, bytes, n, script, pos, stop)
        if not added then
          return nil, k
        end
        lines, count, bytes = added, k, b
      end
      if not nl then
        break
      end
      het = next_het(script, nl + 1)
    elseif c ~= 35 then -- not '#' in column 0: blank, an indented comment, or the header's end
      local _, e = string_find(script, "^[ \t\r\f\v]*", pos)
      if e < stop and string_byte(script, e + 1) ~= 35 then
        break
      end
    elseif c1 == 83 and c2 == 66 then -- "#SB"
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
    lines = NO_LINES
  end
  local comment = job.comment
  -- An anchored find: no substring is made for the usual comment that is not a request.
  local from_comment = type(comment) == "string" and string_find(comment, "^het:") ~= nil
  local count = math_floor(#lines / 2)
  if count > 0 and from_comment then
    return nil, nil, nil, string_format("#HET line %d: the job has #HET lines and a "
      .. "--comment starting with 'het:'; give the request once", lines[1])
  end
  if from_comment then
    local text = string_sub(comment, #M.COMMENT_PREFIX + 1)
    return "comment", text, { 0, text }
  end
  if count == 1 then
    return "script", lines[2], lines
  end
  if count > 0 then
    local texts = {}
    for i = 1, count do
      texts[i] = lines[i * 2]
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
  local count = math_floor(#lines / 2)
  if count == 1 then
    return lines[1]
  end
  local acc = {}
  for i = 1, count do
    acc[i] = lines[i * 2]
    local _, msg = hetreq.parse(table_concat(acc, " "))
    if msg == message then
      return lines[i * 2 - 1]
    end
  end
  return lines[count * 2 - 1]
end

-- The line a key was given on.
local function line_of_key(lines, key)
  for i = 1, #lines, 2 do
    for token in string_gmatch(lines[i + 1], "%S+") do
      if token == key or string_sub(token, 1, #key + 1) == key .. "=" then
        return lines[i]
      end
    end
  end
  return lines[1] or 0
end

-- "#HET line N" (or "--comment het:") for the line a key was given on.
local function at(source, lines, key)
  return where(source, line_of_key(lines, key))
end

-- Explicit device requests -------------------------------------------------------------------

-- The job's own GPU/FPGA requests, from the four fields Slurm 22.05 puts them in:
-- --gres -> tres_per_node, --gpus -> tres_per_job, --gpus-per-task -> tres_per_task,
-- --gpus-per-socket -> tres_per_socket. Entries look like "gres:gpu:2", "gres:gpu:a100:2".

local function devices_in(kind, field, value)
  if not nonempty(value) then
    return nil
  end
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
  return nil
end

-- The first of the four fields, in that order, that asks for this kind of device.
local function explicit_devices(kind, tpn, tpj, tpt, tps)
  return devices_in(kind, "tres_per_node", tpn) or devices_in(kind, "tres_per_job", tpj)
    or devices_in(kind, "tres_per_task", tpt) or devices_in(kind, "tres_per_socket", tps)
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

-- Canonical request text for the record: only validated words, so it holds no quote, brace or
-- byte a reader of the record could trip on.
local LOCALITY_LEVELS = { "nvlink", "numa", "switch" }

local function canonical(req, no_gpu_count)
  -- Each part is "" or " key=value"; one concatenation joins them (no list, no sprintf).
  local nodes, gpus, gtype, gmem, fpga, cores, mem, loc, wait, class, prio, energy, nr, idle =
    "", "", "", "", "", "", "", "", "", "", "", "", "", ""
  local wfor = ""
  if req.nodes ~= 1 then nodes = " nodes=" .. decimal(req.nodes) end
  if no_gpu_count then
    -- the count came from the job's own --gres/--gpus, not from the request
  elseif req.gpus_per_job then
    gpus = " gpus=" .. decimal(req.gpus_per_job)
  elseif req.gpus_per_node > 0 then
    gpus = " gpus-per-node=" .. decimal(req.gpus_per_node)
  end
  if #req.gpu_models > 0 then gtype = " gpu-type=" .. join(req.gpu_models, "|") end
  if req.min_gpu_mem_mib then gmem = " min-gpu-mem=" .. decimal(req.min_gpu_mem_mib) .. "M" end
  if #req.fpga_models > 0 then
    fpga = " fpga=" .. join(req.fpga_models, "|") .. ":" .. decimal(req.fpgas_per_node)
  elseif req.fpgas_per_node > 0 then
    fpga = " fpga=" .. decimal(req.fpgas_per_node)
  end
  if req.cores_per_node ~= 1 then cores = " cores=" .. decimal(req.cores_per_node) end
  if req.mem_per_node_mib then mem = " mem=" .. decimal(req.mem_per_node_mib) .. "M" end
  local locality = req.locality
  if locality.nvlink or locality.numa or locality.switch then
    local levels = {}
    for _, level in ipairs(LOCALITY_LEVELS) do
      if locality[level] then levels[#levels + 1] = level .. ":" .. locality[level] end
    end
    loc = " locality=" .. table_concat(levels, ",")
  end
  if locality.switch_wait_s then wait = " switch-wait=" .. decimal(locality.switch_wait_s) end
  if req.workload_class then class = " class=" .. req.workload_class end
  if req.priority ~= "normal" then prio = " priority=" .. req.priority end
  if req.energy ~= "normal" then energy = " energy=" .. req.energy end
  if req.no_requeue then nr = " no-requeue" end
  if req.on_idle then idle = " on-idle=" .. req.on_idle end
  if req.wait_for then
    wfor = " wait-for=" .. req.wait_for
    if req.wait_for_max_s then wfor = wfor .. ",max=" .. decimal(req.wait_for_max_s) end
  end
  return string_sub(nodes .. gpus .. gtype .. gmem .. fpga .. cores .. mem .. loc .. wait .. class
    .. prio .. energy .. nr .. idle .. wfor, 2)
end
M.canonical = canonical

-- The decision record: one namespaced segment, `<key>:{...}`, a flat JSON object whose
-- values hold no brace or quote. Its fields, in this order: v, rules, mode, src, outcome, class,
-- gpu, fpga, set, kept, on_idle, energy, req; an absent or empty one is left out. Fields are
-- dropped from the end until it fits the bound.
--
-- Values that may come from the job's own options (a GPU or FPGA type named in --gres) are
-- cleaned by decide (foreign); the others are built by the hook from the grammar's checked
-- tokens and the site's checked names, so they hold only these characters already.
local RECORD_UNSAFE = "[^%w _%-.|,:=@]"

local function foreign(v)
  if string_find(v, RECORD_UNSAFE) then
    return (string_gsub(v, RECORD_UNSAFE, "?"))
  end
  return v
end

-- One concatenation for the whole segment (Lua joins all its operands into one string; no
-- sprintf, which string.format calls for every piece). Each optional field is two pieces,
-- '","name":"' and its value (each value's closing quote is the next piece's first byte); an
-- absent field gets "" for both.

local function record_segment(key, max_bytes, digest, mode, src, class, gpu, fpga, set, kept,
                              on_idle, energy, req)
  if set == "" then set = nil end
  if kept == "" then kept = nil end
  if req == "" then req = nil end
  local seg = key .. ':{"v":' .. VERSION_TEXT .. ',"rules":"' .. digest .. '","mode":"' .. mode
    .. '","src":"' .. src .. '","outcome":"rewrite'
    .. (class and '","class":"' or "") .. (class or "")
    .. (gpu and '","gpu":"' or "") .. (gpu or "")
    .. (fpga and '","fpga":"' or "") .. (fpga or "")
    .. (set and '","set":"' or "") .. (set or "")
    .. (kept and '","kept":"' or "") .. (kept or "")
    .. (on_idle and '","on_idle":"' or "") .. (on_idle or "")
    .. (energy and '","energy":"' or "") .. (energy or "")
    .. (req and '","req":"' or "") .. (req or "") .. '"}'
  if #seg <= max_bytes then
    return seg
  end
  -- Too long: fields are dropped from the end until it fits (the first three always stay).
  local parts = { '"v":' .. VERSION_TEXT, '"rules":"' .. digest .. '"', '"mode":"' .. mode .. '"',
                  '"src":"' .. src .. '"', '"outcome":"rewrite"' }
  local n = 5
  if class then n = n + 1; parts[n] = '"class":"' .. class .. '"' end
  if gpu then n = n + 1; parts[n] = '"gpu":"' .. gpu .. '"' end
  if fpga then n = n + 1; parts[n] = '"fpga":"' .. fpga .. '"' end
  if set then n = n + 1; parts[n] = '"set":"' .. set .. '"' end
  if kept then n = n + 1; parts[n] = '"kept":"' .. kept .. '"' end
  if on_idle then n = n + 1; parts[n] = '"on_idle":"' .. on_idle .. '"' end
  if energy then n = n + 1; parts[n] = '"energy":"' .. energy .. '"' end
  if req then n = n + 1; parts[n] = '"req":"' .. req .. '"' end
  seg = key .. ":{" .. table_concat(parts, ",") .. "}"
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

-- The record's marker ("hetslurm:{") is the hook's alone in the record's field: a job that
-- brings one of its own (a forged or unterminated record) is refused at submission, and an
-- update that adds one is refused, so the field never holds more than the hook's segment and
-- every reader (check_modify, act, explain, the audit) reads the hook's decision and only it.
local MARKS = setmetatable({}, { __mode = "k" })
local function marker(rec)
  local m = MARKS[rec]
  if not m then
    m = rec.key .. ":{"
    MARKS[rec] = m
  end
  return m
end

local function reserved_message(rec)
  return "hetslurm: the text '" .. rec.key .. ":{' is reserved for the hook's decision record "
    .. "in the job's " .. rec.field .. "; remove it"
end

-- A message when the job's own text in the record's field holds the marker, else nil.
local function reserved_text(job, rec)
  if rec.field == "none" then
    return nil
  end
  local own = job[rec.field]
  if type(own) == "string" and string_find(own, marker(rec), 1, true) then
    return reserved_message(rec)
  end
  return nil
end

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

-- The decision for a job without a request: shared, never written.
local NO_REQUEST = { action = "none", nw = 0 }

local function reject(d, code, message)
  d.action = "reject"
  d.code = code
  d.message = printable(message, 400)
  return d
end

-- notes, kept and writes are made on first use: most jobs need none of them.
local function note(d, text)
  local notes = d.notes
  if not notes then
    notes = {}
    d.notes = notes
  end
  notes[#notes + 1] = printable(text, 300)
end

-- A field the job set itself and the hook left alone.
local function keep(d, field)
  local kept = d.kept
  if not kept then
    kept = {}
    d.kept = kept
  end
  kept[#kept + 1] = field
end

-- A write is staged with the field's value before it (as decide read it), so apply can restore
-- it without reading the job again: d.writes holds field, value, old for each write in order
-- (old false where the field was unset), d.nw counts them. One flat list, no table per write.
local function stage(d, field, value, old)
  local w, i = d.writes, d.nw * 3
  if not w then
    -- Room for four writes (most rewrites) from the start.
    w = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
    d.writes = w
  end
  w[i + 1] = field
  w[i + 2] = value
  if old == nil then
    old = false
  end
  w[i + 3] = old
  d.nw = d.nw + 1
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

-- The end of every rewrite: the decision record staged in rules.record.field (merged with
-- what other tools keep there), d.action set. Shared by the fast path and the general one.
local function rewrite(d, job, rules, source, class, gpu_text, fpga_text, kept, on_idle, energy,
                       request)
  d.action = "rewrite"
  local rec = rules.record
  if rec.field == "none" then
    return d
  end
  local w, nw, set = d.writes, d.nw, ""
  -- One concatenation for the usual few fields (each '..' step would make a string).
  if nw == 1 then
    set = w[1]
  elseif nw == 2 then
    set = w[1] .. "," .. w[4]
  elseif nw == 3 then
    set = w[1] .. "," .. w[4] .. "," .. w[7]
  elseif nw == 4 then
    set = w[1] .. "," .. w[4] .. "," .. w[7] .. "," .. w[10]
  elseif nw > 4 then
    local names = {}
    for i = 1, nw do
      names[i] = w[i * 3 - 2]
    end
    set = table_concat(names, ",")
  end
  local seg = record_segment(rec.key, rec.max_bytes, rules.digest, rules.mode, source, class,
    gpu_text, fpga_text, set, kept, on_idle, energy, request)
  local old = job[rec.field]
  local merged = seg
  if type(old) == "string" and old ~= "" then
    merged = merge_record(old, seg, rec.key)
  end
  if #merged <= rec.max_field_bytes then
    stage(d, rec.field, merged, old)
    d.record = seg
  else
    d.record_dropped = true
  end
  return d
end

-- A class's default memory per node ([classes.NAME] mem_per_node, rendered as cls.mem; issue 22
-- item 5): only for a job that asks for no memory at all, neither in its request (mem=, which
-- the caller has checked) nor with --mem, --mem-per-cpu or --mem-per-gpu (Slurm refuses a job
-- with two of them). Called by both paths at the same place in the write order.
local function stage_class_mem(d, job, cls)
  local mem = cls and cls.mem
  if mem and job.min_mem_per_node == nil and job.min_mem_per_cpu == nil
      and job.mem_per_tres == nil then
    stage(d, "min_mem_per_node", mem, nil)
  end
end

-- The common request, decided without the grammar's general machinery: "class=NAME" alone or
-- with "gpus=N" (either order; N of one or two digits), for a job that sets none of the
-- fields the general path would weigh against it (--gres/--gpus*, --constraint, --partition,
-- --qos, the record's field). Inside slurmctld the hook runs cold and its cost follows the
-- memory it touches: this path touches a fraction of what parse + decide do. It returns the
-- decision the general path returns for the same job (tests/unit/test_hook_fast_path.py
-- checks that over every class shape, count edge and job option), or nil: anything else,
-- including every mistake, takes the general path and its messages.
local function fast_decide(job, rules, hetreq, source, text)
  local name, count = string_match(text, "^%s*class=([%w_-]+)%s*$")
  if not name then
    name, count = string_match(text, "^%s*class=([%w_-]+)%s+gpus=(%d%d?)%s*$")
    if not name then
      count, name = string_match(text, "^%s*gpus=(%d%d?)%s+class=([%w_-]+)%s*$")
      if not name then
        return nil
      end
    end
  end
  local cls = rules.classes[name]
  if not cls then
    return nil
  end
  local n = count and tonumber(count) or 0
  local limits = hetreq.LIMITS
  if n > limits.gpus_per_node or n > limits.gpus_per_job then
    return nil
  end
  local gpu_models = cls.gpu_models
  if n > 0 and (cls.cpu_only or #rules.gpu_models == 0) then
    return nil -- rejected by the general path, with its message
  end
  local tpn, features = job.tres_per_node, job.features
  if tpn ~= nil or features ~= nil or job.tres_per_job ~= nil or job.tres_per_task ~= nil
      or job.tres_per_socket ~= nil then
    return nil
  end
  local partition, qos = cls.partition, cls.qos
  local ranked = n > 0 and cls.rank
  if ranked then
    local min_nodes = job.min_nodes
    if type(min_nodes) == "number" and min_nodes < NO_VAL and min_nodes > 1 then
      return nil -- several nodes: the general path weighs them against each model's nodes
    end
  end
  local job_partition = (partition or ranked) and job.partition
  local job_qos = qos and job.qos
  if job_partition ~= nil or job_qos ~= nil then
    return nil
  end
  if ranked then
    partition = ranked
  end

  local d = { action = "none", nw = 0, writes = nil, record = nil, done = nil, notes = nil,
              kept = nil }
  local gpu_text, feature
  if n > 0 then
    local models = #gpu_models
    if models == 1 then
      stage(d, "tres_per_node", rules.gres .. "gpu:" .. gpu_models[1] .. ":" .. decimal(n), tpn)
      gpu_text = gpu_models[1]
    else
      stage(d, "tres_per_node", rules.gres .. "gpu:" .. decimal(n), tpn)
      if models > 1 then
        feature = cls.gpu_text
      end
      gpu_text = feature or "any"
    end
  elseif cls.cpu_only then
    feature = rules.cpu_feature
  end
  if feature then
    stage(d, "features", feature, features)
  end
  if partition then
    stage(d, "partition", partition, job_partition)
  end
  if qos then
    stage(d, "qos", qos, job_qos)
  end
  stage_class_mem(d, job, cls)
  return rewrite(d, job, rules, source, name, gpu_text, nil, "", nil, nil,
    count and ("gpus=" .. decimal(n) .. " class=" .. name) or ("class=" .. name))
end

-- The meaning of a request: resolve ------------------------------------------------------------

-- Ranked fallback (docs/fallback.md): a job that accepts several GPU models goes to the
-- per-model partitions of the partition it runs in, in its own order; Slurm then takes the
-- first model free now and falls back at once (equal PriorityTier, measured on every release).
-- The partition it runs in: the class's, else the job's own, else the site's default; a job
-- whose own partition differs from its class's keeps its own and falls back by node weight.
local function rank(r, req, rules, jpart, jnodes)
  local models = r.gpu_models
  if not r.gpu_job or r.gpu_typed_explicit or not models or #models < 2 then
    return
  end
  local base = r.partition
  if jpart ~= nil then
    if base ~= nil and jpart ~= base then
      return
    end
    base = jpart
  end
  base = base or rules.default_partition
  local of = base and rules.ranked[base]
  if not of then
    return
  end
  -- A job runs in one partition: a per-model partition with fewer nodes than the job asks
  -- for cannot hold it (a job wider than every model's nodes keeps the feature OR, which
  -- lets it span models).
  local nodes = jnodes or req.nodes
  local sizes = rules.ranked_nodes
  local list, n = {}, 0
  for _, m in ipairs(models) do
    local p = of[m]
    if p and sizes[p] >= nodes then
      n = n + 1
      list[n] = p
    end
  end
  if n < 2 then
    return
  end
  r.rank_all = table_concat(list, ",")
  if req.wait_for then
    r.partitions = list[1]
  else
    r.partitions = r.rank_all
  end
end

-- resolve(req, given, rules, gx, fx, d, loc) -> r, or nil, family, message
-- What a parsed request means on this site, written once: Python's `resolve` runs this same
-- function (hetslurm.request.language), so explain, place, simulate and relax read the
-- meaning slurmctld enforces. req: hetreq.parse's table; given: the keys the text named; gx,
-- fx: the job's own GPU and FPGA requests (explicit_devices; nil from Python); d: the decision,
-- which collects notes and kept fields; loc(key): the message prefix for where a key was given
-- ("#HET line 3: " in the hook, "" from Python); jpart: the job's own --partition (nil: none,
-- or Python asking about the class's or the default partition); jnodes: the job's own -N
-- (nil: the request's nodes=). The result r:
--   cls                 the class entry of rules.classes (or nil)
--   gpu_job, gpu_count  GPUs asked for, per node (gpu_count nil when the job's own option counts)
--   gpu_models          the models enforced, in preference order ({}: any model)
--   own_gpu_models      the same before energy=low narrowed them (what relax may widen to)
--   gpu_typed_explicit  the job named a GPU type itself (--gres=gpu:a100:2)
--   fpga_job, fpga_models, fpga_typed_explicit   likewise for FPGAs
--   cpu_only            the class runs on CPU-only nodes
--   partition, qos      from the class; qos from priority= when the site maps it
--   partitions          ranked fallback: the per-model partitions the job is submitted to, in
--                       its order ("gpu_a100,gpu_h100"; only the first with wait-for=first),
--                       or nil (docs/fallback.md)
--   rank_all            the whole ranked list (what relax widens a wait-for=first job to)
-- family is a key of codes(): the errno family of the mistake.
local function resolve(req, given, rules, gx, fx, d, loc, jpart, jnodes)
  -- Models named in the request exist on this site (checked first).
  if given["gpu-type"] and #req.gpu_models > 0 then
    local bad = model_check(req.gpu_models, rules.gpu_models, "GPU", "gpu-type", rules.site)
    if bad then
      return nil, "gres", loc("gpu-type") .. bad
    end
  end
  if #req.fpga_models > 0 then
    local bad = model_check(req.fpga_models, rules.fpga_models, "FPGA", "fpga", rules.site)
    if bad then
      return nil, "gres", loc("fpga") .. bad
    end
  end

  local cls
  if req.workload_class then
    cls = rules.classes[req.workload_class]
    if not cls then
      return nil, "feature", string_format(
        "%sclass=%s: site '%s' has no such class%s; classes: %s", loc("class"),
        req.workload_class, rules.site, did_you_mean(req.workload_class, rules.class_names),
        join(rules.class_names, ", "))
    end
  end
  local r = { cls = cls, gpu_job = false, gpu_count = nil, gpu_models = nil,
              own_gpu_models = nil, gpu_typed_explicit = false, fpga_job = false,
              fpga_models = nil, fpga_typed_explicit = false, cpu_only = cls and cls.cpu_only
              or false, partition = cls and cls.partition, qos = nil }

  -- GPUs: the job's own option counts; a type it names beats gpu-type=, which beats the class.
  local gpu_models
  if gx then
    r.gpu_job = (gx.count == nil) or gx.count > 0
    if given["gpus"] or given["gpus-per-node"] then
      note(d, string_format("%sgpus ignored: the job asks for GPUs with %s (%s)",
        loc(given["gpus"] and "gpus" or "gpus-per-node"), OPTION_OF[gx.field], gx.entry))
      keep(d, gx.field)
    end
    if gx.model then
      r.gpu_typed_explicit = true
      if given["gpu-type"] then
        note(d, string_format("%sgpu-type ignored: the job names GPU type '%s' with %s",
          loc("gpu-type"), gx.model, OPTION_OF[gx.field]))
        keep(d, gx.field)
      end
      gpu_models = { gx.model }
    end
  else
    r.gpu_count = req.gpus_per_node
    r.gpu_job = r.gpu_count > 0
  end
  local gpu_job = r.gpu_job

  if r.cpu_only and (gpu_job or req.fpgas_per_node > 0 or (fx and (fx.count or 1) > 0)) then
    return nil, "config", string_format(
      "%sclass=%s runs on CPU-only nodes, but the job asks for GPUs or FPGAs; drop them or "
      .. "choose another class (%s)", loc("class"), req.workload_class,
      join(rules.class_names, ", "))
  end
  if gpu_job and #rules.gpu_models == 0 then
    return nil, "gres", string_format("%sthe job asks for GPUs; site '%s' has none",
      loc(given["gpus"] and "gpus" or "gpus-per-node"), rules.site)
  end

  if gpu_job and not r.gpu_typed_explicit then
    if given["gpu-type"] then
      gpu_models = req.gpu_models -- gpu-type=any ({}) beats the class too
    elseif cls then
      gpu_models = cls.gpu_models -- the class's GPU models in its order (rendered)
    else
      gpu_models = {}
    end
  end

  if gpu_job and req.min_gpu_mem_mib then
    local floor = req.min_gpu_mem_mib
    local named = given["gpu-type"] and #req.gpu_models > 0 or r.gpu_typed_explicit
    local pool = (#(gpu_models or {}) > 0) and gpu_models or rules.gpu_models
    local fit = {}
    for _, m in ipairs(pool) do
      local mem = rules.gpu_mem[m]
      if mem and mem >= floor then
        fit[#fit + 1] = m
      elseif named then
        return nil, "gres", string_format(
          "%smin-gpu-mem=%dM: gpu-type %s has %s; drop it or lower min-gpu-mem",
          loc("min-gpu-mem"), floor, m, mem and (mem .. " MiB") or "unknown memory")
      end
    end
    if #fit == 0 then
      return nil, "gres", string_format("%smin-gpu-mem=%dM: no GPU model of site '%s' "
        .. "has that much memory", loc("min-gpu-mem"), floor, rules.site)
    end
    gpu_models = fit
  end
  r.own_gpu_models = gpu_models

  -- energy=low narrows the acceptable models to the site's low-energy ones, when any of them
  -- is one (docs/directives.md); rebalance's relax step may widen them back.
  if gpu_job and req.energy == "low" and #rules.energy_low_models > 0
      and not r.gpu_typed_explicit then
    local pool = (#gpu_models > 0) and gpu_models or rules.gpu_models
    local low = {}
    for _, m in ipairs(pool) do
      if contains(rules.energy_low_models, m) then
        low[#low + 1] = m
      end
    end
    if #low > 0 then
      gpu_models = low
    else
      note(d, loc("energy") .. "energy=low: none of the acceptable GPU models "
        .. "is one of the site's low-energy models; the job keeps its models")
    end
  end
  r.gpu_models = gpu_models

  -- FPGAs: likewise, without memory or energy.
  if fx then
    r.fpga_job = (fx.count == nil) or fx.count > 0
    if given["fpga"] then
      note(d, string_format("%sfpga ignored: the job asks for FPGAs with --gres (%s)",
        loc("fpga"), fx.entry))
      keep(d, fx.field)
    end
    r.fpga_typed_explicit = fx.model ~= nil
  else
    r.fpga_job = req.fpgas_per_node > 0
    if r.fpga_job then
      if #rules.fpga_models == 0 then
        return nil, "gres", string_format("%sthe job asks for FPGAs; site '%s' has none",
          loc("fpga"), rules.site)
      end
      if #req.fpga_models > 0 then
        r.fpga_models = req.fpga_models
      elseif cls then
        r.fpga_models = cls.fpga_models
      else
        r.fpga_models = {}
      end
    end
  end

  -- QOS: priority= where the site maps it, else the class's.
  local qos = rules.priority_qos[req.priority]
  if not (given["priority"] and qos) then
    qos = cls and cls.qos or nil
  end
  r.qos = qos
  rank(r, req, rules, jpart, jnodes)
  if req.wait_for and not r.partitions then
    note(d, loc("wait-for") .. "wait-for=first has no effect: the job has no ranked GPU "
      .. "list to fall back along here (one model, any model, or its own partition)")
  end
  return r
end
M.resolve = resolve

-- The Slurm fields: stage -------------------------------------------------------------------

-- GPUs and FPGAs as gres and features. Returns the record's gpu and fpga texts, or nil, nil,
-- message when the two model lists cannot both be enforced.
local function stage_devices(d, job, req, r, rules, gx, fx, loc)
  local tpn = job.tres_per_node
  local gpu_job, fpga_job, gpu_models, fpga_models = r.gpu_job, r.fpga_job, r.gpu_models,
    r.fpga_models
  -- At most one feature expression may be added (nfeatures counts the candidates) and at most
  -- a GPU and an FPGA entry appended to tres_per_node: locals, not lists.
  local feature, nfeatures = nil, 0
  local gres_new
  local typed_tres -- tres_per_node as staged below, when the job's own --gres got its type
  local gpu_text, fpga_text -- the record's gpu and fpga values
  if gpu_job and not r.gpu_typed_explicit then
    if gx then
      if #gpu_models == 1 then
        -- The job's own count, now typed: hard.
        local typed = rules.gres .. "gpu:" .. gpu_models[1] .. ":" .. decimal(gx.count or 1)
        typed_tres = replace_entry(gx.value, gx.index, typed)
        stage(d, gx.field, typed_tres, gx.value)
        if gx.field ~= "tres_per_node" then
          typed_tres = nil
        end
      elseif #gpu_models > 1 then
        feature, nfeatures = join(gpu_models, "|"), 1
      end
    else
      local count = decimal(r.gpu_count)
      if #gpu_models == 1 then
        gres_new = rules.gres .. "gpu:" .. gpu_models[1] .. ":" .. count
      else
        gres_new = rules.gres .. "gpu:" .. count
        if #gpu_models > 1 then
          feature, nfeatures = join(gpu_models, "|"), 1
        end
      end
    end
  end
  if gpu_job then
    gpu_text = (gpu_models and #gpu_models > 0) and (feature or join(gpu_models, "|")) or "any"
  end
  if fpga_job and not fx then
    local entry
    if #fpga_models == 1 then
      entry = rules.gres .. "fpga:" .. fpga_models[1] .. ":" .. decimal(req.fpgas_per_node)
    else
      entry = rules.gres .. "fpga:" .. decimal(req.fpgas_per_node)
      if #fpga_models > 1 then
        nfeatures = nfeatures + 1
        feature = feature or join(fpga_models, "|")
      end
    end
    gres_new = gres_new and (gres_new .. "," .. entry) or entry
  end
  if fpga_job then
    fpga_text = r.fpga_typed_explicit and fx.model
      or ((fpga_models and #fpga_models > 0) and join(fpga_models, "|") or "any")
  end
  if r.cpu_only then
    nfeatures = nfeatures + 1
    feature = feature or rules.cpu_feature
  end

  if gres_new then
    local new = gres_new
    if typed_tres then
      new = typed_tres .. "," .. new
    elseif type(tpn) == "string" and tpn ~= "" then
      new = tpn .. "," .. new
    end
    stage(d, "tres_per_node", new, tpn)
  end

  if nfeatures > 1 then
    -- Two OR groups joined by '&' have no grouping Slurm 22.05 documents for this use.
    return nil, nil, loc("gpu-type") .. "a GPU model list and an FPGA model list cannot both "
      .. "be enforced in one job on Slurm 22.05; name one model for one of them"
  end
  if feature then
    local mine = feature
    local theirs = job.features
    if type(theirs) == "string" and theirs ~= "" then
      if string_find(mine, "|", 1, true) or not and_only(theirs) then
        note(d, string_format("%s--constraint=%s kept; '%s' not added: add it to your "
          .. "--constraint or drop --constraint", loc(r.cpu_only and "class" or "gpu-type"),
          printable(theirs, 60), mine))
        keep(d, "features")
      else
        stage(d, "features", theirs .. "&" .. mine, theirs)
      end
    else
      stage(d, "features", mine, theirs)
    end
  end
  -- A GPU or FPGA type the job named itself (--gres) is the user's text: cleaned.
  if r.gpu_typed_explicit and gpu_text then
    gpu_text = foreign(gpu_text)
  end
  if r.fpga_typed_explicit and fpga_text then
    fpga_text = foreign(fpga_text)
  end
  return gpu_text, fpga_text
end

-- A field the job set itself wins over the request's value: kept, with a note when they differ.
local function stage_or_keep(d, field, value, current, prefix, option, over)
  if type(current) == "string" and current ~= "" then
    if current ~= value then
      note(d, string_format("%s%s=%s kept over %s", prefix, option, printable(current, 60),
        over))
      keep(d, field)
    end
  else
    stage(d, field, value, current)
  end
end

-- Nodes, cores, memory. Returns the job's node count as Slurm will see it.
local function stage_shape(d, job, req, given, loc)
  local nodes = req.nodes
  local min_nodes = job.min_nodes
  if given["nodes"] then
    if type(min_nodes) == "number" and min_nodes < NO_VAL then
      if min_nodes ~= req.nodes then
        note(d, string_format("%snodes ignored: the job asks for -N %d", loc("nodes"),
          min_nodes))
        keep(d, "min_nodes")
      end
      nodes = min_nodes
    else
      stage(d, "min_nodes", req.nodes, min_nodes)
      stage(d, "max_nodes", req.nodes, job.max_nodes)
    end
  elseif type(min_nodes) == "number" and min_nodes < NO_VAL then
    nodes = min_nodes
  end

  if given["cores"] then
    local pn_min_cpus = job.pn_min_cpus
    if is_set16(pn_min_cpus) or is_set16(job.cpus_per_task)
        or is_set16(job.ntasks_per_node) or is_set32(job.num_tasks) then
      note(d, loc("cores") .. "cores ignored: the job sets its own task layout "
        .. "(--ntasks, --cpus-per-task, --ntasks-per-node or --mincpus)")
      keep(d, "pn_min_cpus")
    else
      stage(d, "pn_min_cpus", req.cores_per_node, pn_min_cpus)
    end
  end

  if req.mem_per_node_mib then
    local min_mem_per_node = job.min_mem_per_node
    if min_mem_per_node ~= nil or job.min_mem_per_cpu ~= nil then
      note(d, loc("mem") .. "mem ignored: the job sets --mem or --mem-per-cpu")
      keep(d, "min_mem_per_node")
    else
      stage(d, "min_mem_per_node", req.mem_per_node_mib, min_mem_per_node)
    end
  end
  return nodes
end

-- Locality: gres binding, one socket, one leaf switch.
local function stage_locality(d, job, req, r, rules, slurm, nodes, given, loc)
  local loc_req = req.locality
  local has_devices = r.gpu_job or r.fpga_job
  local bind = (loc_req.nvlink == "required") or (loc_req.numa == "required" and has_devices)
  if bind then
    local job_flags = job.bitflags
    local flags = job_flags
    local enforce = slurm.GRES_ENFORCE_BIND or 16
    local disable = slurm.GRES_DISABLE_BIND or 524288
    if type(flags) ~= "number" then
      flags = 0
    end
    if math_floor(flags / disable) % 2 == 1 then
      note(d, loc("locality") .. "--gres-flags=disable-binding kept; locality not enforced")
      keep(d, "bitflags")
    elseif math_floor(flags / enforce) % 2 == 0 then
      stage(d, "bitflags", flags + enforce, job_flags)
    end
  end
  if loc_req.numa == "required" and not has_devices then
    local sockets_per_node = job.sockets_per_node
    if is_set16(sockets_per_node) then
      note(d, loc("locality") .. "numa: the job's --sockets-per-node kept")
      keep(d, "sockets_per_node")
    else
      stage(d, "sockets_per_node", 1, sockets_per_node)
      local cores_per_socket = given["cores"] and job.cores_per_socket
      if given["cores"] and not is_set16(cores_per_socket) then
        stage(d, "cores_per_socket", req.cores_per_node, cores_per_socket)
      end
    end
  end
  if loc_req.switch then
    local req_switch = job.req_switch
    if type(req_switch) == "number" and req_switch < NO_VAL then
      note(d, loc("locality") .. "the job's --switches kept")
      keep(d, "req_switch")
    elseif nodes > 1 then
      stage(d, "req_switch", 1, req_switch)
      stage(d, "wait4switch", loc_req.switch_wait_s or rules.switch_wait_default,
        job.wait4switch)
    else
      note(d, loc("locality") .. "switch: a one-node job is always under one switch")
    end
  end
end

local function stage_requeue(d, job, req, loc)
  if req.no_requeue then
    local requeue = job.requeue
    if is_set16(requeue) and requeue ~= 0 then
      note(d, loc("no-requeue") .. "no-requeue ignored: the job asks for --requeue")
      keep(d, "requeue")
    elseif not is_set16(requeue) then
      stage(d, "requeue", 0, requeue)
    end
  end
end

-- A job may not name a per-model partition of ranked fallback itself: that would bypass the
-- class order (and, on a site that relies on it, the hook). The message, or nil.
local function internal_partition(partition, rules)
  if type(partition) ~= "string" then
    return nil
  end
  for p in string_gmatch(partition, "[^,]+") do
    local info = rules.internal[p]
    if info then
      return string_format("hetslurm: partition %s holds partition %s's %s nodes for "
        .. "hetslurm's ranked fallback and is not submitted to directly; use -p %s with "
        .. "#HET gpu-type=%s (or --gres=gpu:%s:N)", p, info.base, info.model, info.base,
        info.model, info.model)
    end
  end
  return nil
end
M.internal_partition = internal_partition

-- The decision: parse -> resolve -> stage -> record ------------------------------------------

-- decide(job, rules, hetreq, slurm) -> decision table (see docs/hook.md):
--   action   "none" (no request), "rewrite" or "reject"
--   writes   { field, value, old, field, value, old, ... } in write order, nw of them;
--            notes: lines for the user
--   code, message (reject); record (the segment written to rules.record.field)
local function decide_request(job, rules, hetreq, slurm)
  local C = codes(slurm)
  local forged = reserved_text(job, rules.record)
  if forged then
    return reject({ action = "none", nw = 0 }, C.access, forged)
  end
  local internal = rules.internal
  internal = internal and next(internal) and internal_partition(job.partition, rules)
  if internal then
    return reject({ action = "none", nw = 0 }, C.access, internal)
  end
  local source, text, lines, err = request_text(job)
  if not source and not err then
    return NO_REQUEST
  end
  if not err then
    local fast = fast_decide(job, rules, hetreq, source, text)
    if fast then
      return fast
    end
  end
  -- One constructor sized for the fields a rewrite usually gets (no rehash as it fills).
  local d = { action = "none", nw = 0, writes = nil, record = nil, done = nil, notes = nil,
              kept = nil }
  if err then
    return reject(d, C.generic, err)
  end

  -- Each job_desc read is a C call that walks the plugin's list of names: read these once.
  local tpn, tpj, tpt, tps = job.tres_per_node, job.tres_per_job, job.tres_per_task,
    job.tres_per_socket
  local gx, fx
  if tpn or tpj or tpt or tps then
    gx = explicit_devices("gpu", tpn, tpj, tpt, tps)
    fx = explicit_devices("fpga", tpn, tpj, tpt, tps)
  end

  -- Parse.
  local req, msg = hetreq.parse(text)
  local synthetic_gpus = false
  if not req and gx and (gx.count or 1) > 0 then
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
  local request = canonical(req, synthetic_gpus)
  -- The keys the text named (hetreq's key -> word map; this call's own table).
  local given = req.tokens
  if synthetic_gpus then
    given["gpus-per-node"] = nil
  end
  local function loc(key)
    return at(source, lines, key) .. ": "
  end

  -- Resolve.
  local jpart, jnodes = job.partition, job.min_nodes
  if type(jnodes) ~= "number" or jnodes >= NO_VAL then
    jnodes = nil
  end
  local r, family, message = resolve(req, given, rules, gx, fx, d, loc, jpart, jnodes)
  if not r then
    return reject(d, C[family], message)
  end

  -- Stage.
  local gpu_text, fpga_text, conflict = stage_devices(d, job, req, r, rules, gx, fx, loc)
  if conflict then
    return reject(d, C.feature, conflict)
  end
  if r.partitions then
    stage(d, "partition", r.partitions, jpart)
  elseif r.partition then
    stage_or_keep(d, "partition", r.partition, jpart, loc("class"), "--partition",
      "class=" .. req.workload_class .. "'s partition " .. r.partition)
  end
  if req.priority == "high" and not may_use_high(job, rules) then
    return reject(d, C.access, string_format("%spriority=high is not allowed for user %s "
      .. "(site policy); use priority=normal or ask the site's admins", loc("priority"),
      printable(as_text(job.user_name or job.user_id), 40)))
  end
  if r.qos then
    stage_or_keep(d, "qos", r.qos, job.qos, loc(given["priority"] and "priority" or "class"),
      "--qos", r.qos)
  end
  local nodes = stage_shape(d, job, req, given, loc)
  if not req.mem_per_node_mib and req.workload_class then
    stage_class_mem(d, job, rules.classes[req.workload_class])
  end
  stage_locality(d, job, req, r, rules, slurm, nodes, given, loc)
  stage_requeue(d, job, req, loc)

  -- Record.
  return rewrite(d, job, rules, source, req.workload_class, gpu_text, fpga_text,
    d.kept and join(d.kept, ",") or "", req.on_idle, req.energy ~= "normal" and req.energy or nil,
    request)
end

-- Classification from history (issue 22) ------------------------------------------------------

-- rules.classify, rendered from the site's [classify] section (hetslurm/site/hook_rules.py
-- classify_table), is absent unless its mode is suggest or apply and it has rules: then a job
-- costs nothing more than reading that one missing field. With it, a job costs one read of
-- its name and one table lookup; only a job whose name some rule holds has its user read.
-- A rule applies to a job that names no class: one without a request of its own, or whose
-- #HET / het: request has no class=. It never turns an accepted job into a rejected one:
-- a rejected job is left to its own message, and an applied class that would be refused
-- (the job's own --gres asks for GPUs and the class is CPU-only) is only suggested.
local setmetatable = setmetatable

-- A request's keys left out when a CPU-only class is applied (what the class replaces).
local DEVICE_KEYS = { gpus = true, ["gpus-per-node"] = true, ["gpu-type"] = true,
                      ["min-gpu-mem"] = true, fpga = true }

-- The request as the class would be applied: the job's own words in the grammar's key order
-- (device words dropped for a CPU-only class), then class=NAME. Returns text, dropped words.
local function applied_request(req, hetreq, cls, class)
  local words, dropped = {}, nil
  if req then
    local tokens = req.tokens
    for _, key in ipairs(hetreq.KEYS) do
      local w = tokens[key]
      if w then
        if cls.cpu_only and (DEVICE_KEYS[key] or (key == "locality"
            and string_find(w, "nvlink", 1, true))) then
          dropped = dropped and (dropped .. " " .. w) or w
        else
          words[#words + 1] = w
        end
      end
    end
  end
  words[#words + 1] = "class=" .. class
  return table_concat(words, " "), dropped
end

-- The record's segment with the classification added ("infer", "how"), staged in place of
-- the one rewrite() staged last. src: where the job's own request came from, for an applied
-- class (decided from a script the hook made: "history" when the job brought no request).
local function record_classified(d, job, rules, class, how, src)
  local rec, seg = rules.record, d.record
  if not seg then
    return
  end
  if src and src ~= "script" then
    local s, e = string_find(seg, '"src":"script"', 1, true)
    if s then
      seg = string_sub(seg, 1, s - 1) .. '"src":"' .. src .. '"' .. string_sub(seg, e + 1)
    end
  end
  seg = string_sub(seg, 1, -2) .. ',"infer":"' .. class .. '","how":"' .. how .. '"}'
  if #seg > rec.max_bytes then
    return -- the record stays as the decision wrote it; the user is still told
  end
  local old = job[rec.field]
  local merged = seg
  if type(old) == "string" and old ~= "" then
    merged = merge_record(old, seg, rec.key)
  end
  if #merged > rec.max_field_bytes then
    return
  end
  local k = d.nw * 3
  d.writes[k - 1] = merged
  d.writes[k] = old == nil and false or old
  d.record = seg
end

local function classify(d, job, rules, hetreq, slurm, cf)
  local name = job.name
  if type(name) ~= "string" then
    return d
  end
  local by_user = cf.names[name]
  if by_user == nil then
    return d
  end
  local user = job.user_name
  local rule = type(user) == "string" and by_user[user] or nil
  if type(rule) ~= "string" then
    return d
  end
  local class, rule_why = string_match(rule, "^([^\t]*)\t(.*)$")
  local cls = class and rules.classes[class]
  if not cls then
    return d
  end
  local source, text = request_text(job)
  local req
  if source then
    req = hetreq.parse(text)
    if not req or req.workload_class then
      return d -- the job named its class (or its request is read another way: left alone)
    end
  end
  local why = printable(rule_why, 160)
  local how, message = "suggest", nil
  if cf.mode == "apply" then
    local request, dropped = applied_request(req, hetreq, cls, class)
    -- The job with the applied request in its script: every other field reads through.
    local proxy = setmetatable({ script = "#!/bin/sh\n#HET " .. request .. "\n" },
      { __index = function(_, k) return job[k] end })
    if source == "comment" then
      proxy.comment = false -- the request now comes from the proxy's script
    end
    local applied = decide_request(proxy, rules, hetreq, slurm)
    if applied.action == "rewrite" then
      d, how = applied, "apply"
      message = "hetslurm: class=" .. class .. " applied from this job's history (" .. why
        .. ")" .. (dropped and ("; left out: " .. dropped) or "")
        .. "; to choose yourself, put class=NAME in a #HET line"
    else
      message = "hetslurm: class=" .. class .. " suggested from this job's history (" .. why
        .. ") but not applied: "
        .. printable((string_gsub(applied.message or "", "^#HET line %d+: ", "")), 120)
    end
  end
  if not message then
    message = "hetslurm: class=" .. class .. " suggested from this job's history (" .. why
      .. "); to use it, add '#HET class=" .. class .. "'"
  end
  if d.action == "none" then
    -- No request of its own: the suggestion is recorded (a record-only rewrite).
    d = { action = "none", nw = 0, writes = nil, record = nil, done = nil, notes = nil,
          kept = nil }
    rewrite(d, job, rules, "history", nil, nil, nil, "", nil, nil, nil)
  end
  record_classified(d, job, rules, class, how, how == "apply" and (source or "history") or nil)
  note(d, message)
  return d
end

-- decide(job, rules, hetreq, slurm) -> decision table (see decide_request above); with the
-- site's classification rules, a job that names no class may be told or given one.
function M.decide(job, rules, hetreq, slurm)
  local d = decide_request(job, rules, hetreq, slurm)
  local cf = rules.classify
  if cf == nil or d.action == "reject" then
    return d
  end
  return classify(d, job, rules, hetreq, slurm, cf)
end

-- One line for slurmctld.log (slurm.log_info).
function M.describe(d, job_label)
  local parts = { "hetslurm:", job_label, d.action }
  if d.action == "reject" then
    parts[#parts + 1] = "code=" .. as_text(d.code)
    parts[#parts + 1] = d.message
  else
    local w = d.writes
    for i = 1, d.nw * 3, 3 do
      parts[#parts + 1] = w[i] .. "=" .. printable(as_text(w[i + 1]), 200)
    end
    if d.notes then
      parts[#parts + 1] = "kept=" .. (d.kept and join(d.kept, ",") or "")
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
  local w = d.writes
  for i = 1, d.nw do
    local k = i * 3
    job[w[k - 2]] = w[k - 1]
    d.done = i
  end
end

local function write_one(job, field, value)
  job[field] = value
end

function M.apply(job, d)
  local w, nw = d.writes, d.nw
  for i = 1, nw * 3, 3 do
    local field, value = w[i], w[i + 1]
    local want = NUMERIC[field] and "number" or "string"
    if type(value) ~= want then
      return false, "staged " .. field .. " is a " .. type(value) .. ", not a " .. want
    end
  end
  d.done = 0
  local ok, err = pcall(write_staged, job, d)
  if ok then
    return true
  end
  -- Back to the values decide read, last write first (a field staged twice ends at its
  -- value before the first).
  for i = d.done, 1, -1 do
    local k = i * 3
    local value = w[k]
    if value == false then
      value = "" -- the 22.05 setters turn "" into "unset" on submission
    end
    pcall(write_one, job, w[k - 2], value)
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
  local internal = rules.internal
  if internal and next(internal) then
    local new_part = job.partition
    if type(new_part) == "string" and new_part ~= job_rec.partition then
      local msg = internal_partition(new_part, rules)
      if msg then
        return C.access, msg
      end
    end
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
  local mark = marker(rec)
  local current = job_rec[rec.field]
  local fields, seg = record_fields(current, rec.key)
  if fields and string_find(current, mark, string_find(current, seg, 1, true) + 1, true) then
    -- A record followed by another marker (a job submitted before markers were refused):
    -- which one is the hook's cannot be told, so nothing the record protects may change.
    return C.access, "hetslurm: the job's " .. rec.field .. " holds more than one '" .. mark
      .. "' segment; ask an administrator to change it"
  end
  local new_rec = job[rec.field]
  if type(new_rec) == "string" then
    local at = seg and string_find(new_rec, seg, 1, true)
    if seg and not at then
      return C.access, "hetslurm: the " .. rec.field .. " segment '" .. rec.key
        .. ":{...}' is the hook's decision record; keep it when you change the field"
    end
    -- The only marker allowed in the new text is the record's own, where it stands.
    local first = string_find(new_rec, mark, 1, true)
    if first and (first ~= at or string_find(new_rec, mark, at + 1, true)) then
      return C.access, reserved_message(rec)
    end
  end
  if not fields then
    return nil
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
