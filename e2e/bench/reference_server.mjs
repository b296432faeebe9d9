// The Node reference server (@durable-streams/server, pinned in package.json),
// file-backed, for the side-by-side benchmark.
//
//   node reference_server.mjs PORT DATA_DIR LONG_POLL_MS
//
// With `dataDir` it uses its FileBackedStreamStore: one log file per stream,
// fdatasync after each append before the LMDB metadata commit. Its options
// have no switch to turn fsync off, and none is set here. compression stays
// at its default (on); the benchmark clients never send Accept-Encoding, so
// no response is compressed.
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
let stopping = false
const stop = async () => {
  if (stopping) return
  stopping = true
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
