-- wrk script: POST fixed-size binary appends over a set of stream URLs.
--
--   wrk -tT -cC -dDs --latency -s append.lua URL -- PREFIX STREAMS SIZE THREADS
--
-- Thread number i (0-based) sends its n-th request to stream
-- PREFIX .. ((i + n * THREADS) % STREAMS). With -tN -cN and STREAMS = N each
-- connection is alone on its own stream; with STREAMS = 1 every request goes
-- to PREFIX0. Requests are formatted once, in init(). No response() hook:
-- it would make wrk parse every header and cost client CPU.
-- done() prints one line "BENCH {json}" that run.py parses.

local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end

function init(args)
  local prefix = args[1]
  streams = tonumber(args[2])
  local size = tonumber(args[3])
  threads = tonumber(args[4])
  local body = string.rep("x", size)
  local headers = { ["Content-Type"] = "application/octet-stream" }
  reqs = {}
  for s = 0, streams - 1 do
    reqs[s] = wrk.format("POST", "/v1/stream/" .. prefix .. s, headers, body)
  end
  n = 0
end

function request()
  local s = (id + n * threads) % streams
  n = n + 1
  return reqs[s]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"status_errors":%d,"socket_errors":%d,"seconds":%.6f,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, e.status, e.connect + e.read + e.write + e.timeout,
    summary.duration / 1e6, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
