// The official suite, pointed at the server named by CONFORMANCE_TEST_URL.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required")

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? "2000"),
  subscriptions: true,
})
