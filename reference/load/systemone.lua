-- wrk script for kev_server: POST /v1/systemone with the body of request.json (next to this script;
-- KEV_LOAD_BODY overrides it), in KEV_LOAD_STATES (default 8) variants whose string state starts with
-- "Ticket <4411..>: ", cycled per connection as kev_load does. Prints one "kev_load: ..." line.
--   wrk -t2 -c64 -d30s --timeout 600s -s reference/load/systemone.lua http://127.0.0.1:8008/v1/systemone

local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
local path = os.getenv("KEV_LOAD_BODY") or (here .. "request.json")
local file = assert(io.open(path, "r"), "cannot read " .. path)
local base = file:read("*a")
file:close()

local n_states = tonumber(os.getenv("KEV_LOAD_STATES") or "8")
local bodies = {}
for i = 1, n_states do
  local body, found = base:gsub('"state": "', '"state": "Ticket ' .. (4410 + i) .. ': ', 1)
  assert(found == 1, path .. ' must hold a string "state"')
  bodies[i] = body
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local api_key = os.getenv("KEV_API_KEY")
if api_key then wrk.headers["Authorization"] = "Bearer " .. api_key end

local counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, bodies[((counter - 1) % n_states) + 1])
end

done = function(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout +
                 summary.errors.status
  io.write(string.format("kev_load: requests=%d errors=%d seconds=%.1f rps=%.2f p50_ms=%.1f p95_ms=%.1f p99_ms=%.1f\n",
                         summary.requests, errors, seconds, summary.requests / seconds,
                         latency:percentile(50) / 1e3, latency:percentile(95) / 1e3, latency:percentile(99) / 1e3))
end
