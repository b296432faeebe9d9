// Starts the Node reference server, file-backed, for the benchmark.
// usage: node reference_server.mjs PORT DATA_DIR LONG_POLL_MS
import { DurableStreamTestServer } from "@durable-streams/server"

const [port, dataDir, longPollMs] = process.argv.slice(2)
const server = new DurableStreamTestServer({
  port: Number(port),
  host: "127.0.0.1",
  dataDir,
  longPollTimeout: Number(longPollMs),
})
const url = await server.start()
console.log(`reference server on ${url} with data in ${dataDir}`)
const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
