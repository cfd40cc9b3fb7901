// interop.js: kafkajs (a pure-JavaScript Kafka client, no librdkafka, no
// franz-go) on both sides of dam, driven by interop_test.go.
//
//   node interop.js produce  --brokers B --topic T            < records.json
//   node interop.js consume  --brokers B --topic T --count N
//                            [--isolation-level read_committed|read_uncommitted]
//                            [--timeout-ms MS]
//
// produce writes a JSON array of {"key": "...", "value": "..."|null} to the
// topic (null is a tombstone) with kafkajs's defaults: its default
// partitioner (murmur2, as the Java client) and no compression.
//
// consume reads the topic from the beginning in a fresh consumer group with
// kafkajs's default codecs (gzip only: no snappy, lz4 or zstd plugin is
// registered, as a new user would run it) and prints one JSON line per
// record, {"partition", "offset", "key", "value"}, in each partition's
// order, then exits 0 once it has N records. Any error (a fetch it cannot
// decode, a timeout) is printed to stderr and exits 1.
//
// --isolation-level is the hook for exactly-once mode: read_committed (the
// default, as kafkajs's) hides aborted transactions and waits for open ones.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

function parseArgs(argv) {
  const [cmd, ...rest] = argv
  const opts = { cmd, isolationLevel: 'read_committed', timeoutMs: 30000 }
  for (let i = 0; i < rest.length; i += 2) {
    const name = rest[i]
    const value = rest[i + 1]
    if (value === undefined) throw new Error(`${name}: missing value`)
    switch (name) {
      case '--brokers': opts.brokers = value.split(','); break
      case '--topic': opts.topic = value; break
      case '--count': opts.count = Number(value); break
      case '--isolation-level':
        if (value !== 'read_committed' && value !== 'read_uncommitted') {
          throw new Error(`--isolation-level: want read_committed or read_uncommitted, got ${value}`)
        }
        opts.isolationLevel = value
        break
      case '--timeout-ms': opts.timeoutMs = Number(value); break
      default: throw new Error(`unknown option ${name}`)
    }
  }
  if (!opts.brokers || !opts.topic) throw new Error('--brokers and --topic are required')
  if (cmd === 'consume' && !(opts.count >= 0)) throw new Error('consume: --count is required')
  return opts
}

function client(opts) {
  return new Kafka({
    clientId: 'dam-interop',
    brokers: opts.brokers,
    logLevel: logLevel.ERROR,
    retry: { retries: 3 },
  })
}

async function readStdin() {
  const chunks = []
  for await (const c of process.stdin) chunks.push(c)
  return Buffer.concat(chunks).toString('utf8')
}

async function produce(opts) {
  const records = JSON.parse(await readStdin())
  const producer = client(opts).producer()
  await producer.connect()
  try {
    // One record per send, in order: the order of one key's records is
    // what dam's decisions depend on.
    for (const r of records) {
      await producer.send({ topic: opts.topic, messages: [{ key: r.key, value: r.value }] })
    }
  } finally {
    await producer.disconnect()
  }
}

async function consume(opts) {
  const consumer = client(opts).consumer({
    groupId: `dam-interop-${process.pid}-${Date.now()}`,
    readUncommitted: opts.isolationLevel === 'read_uncommitted',
  })
  let seen = 0
  let settle
  const done = new Promise((resolve, reject) => { settle = { resolve, reject } })
  const timer = setTimeout(() => settle.reject(new Error(`timed out after ${opts.timeoutMs}ms with ${seen} of ${opts.count} records`)), opts.timeoutMs)
  // A fetch kafkajs cannot decode (a codec it lacks) crashes the consumer:
  // report it instead of letting the runner retry it forever.
  consumer.on(consumer.events.CRASH, (e) => settle.reject(e.payload.error))
  if (opts.count === 0) settle.resolve()
  try {
    await consumer.connect()
    await consumer.subscribe({ topics: [opts.topic], fromBeginning: true })
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        process.stdout.write(JSON.stringify({
          partition,
          offset: Number(message.offset),
          key: message.key === null ? null : message.key.toString('utf8'),
          value: message.value === null ? null : message.value.toString('utf8'),
        }) + '\n')
        seen++
        if (seen >= opts.count) settle.resolve()
      },
    })
    await done
  } finally {
    clearTimeout(timer)
    await consumer.disconnect().catch(() => {})
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2))
  switch (opts.cmd) {
    case 'produce': return produce(opts)
    case 'consume': return consume(opts)
    default: throw new Error(`unknown command ${opts.cmd}: want produce or consume`)
  }
}

main().then(() => process.exit(0), (err) => {
  process.stderr.write(`interop.js: ${err && err.name ? err.name + ': ' : ''}${err && err.message ? err.message : err}\n`)
  process.exit(1)
})
