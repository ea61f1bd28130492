'use strict'
// The MQTT.js driver of tests/interop: reads the JSON commands of tests/interop/README.md from
// stdin, one a line, turns them into MQTT.js calls and writes results and events to stdout.

const readline = require('node:readline')
const { Connection } = require('./connection')
const protocol = require('./protocol')

const DEFAULT_TIMEOUT_MS = 10000
// The scenario kills a node and expects the client back within about a second.
const RECONNECT_PERIOD_MS = 500

// -- the commands --------------------------------------------------------------------------------

let connection = null
let exitRequested = false

function connected() {
  if (!connection) throw new protocol.CommandError('not connected: send connect first')
  return connection
}

function connectProperties(cmd, version) {
  const sessionExpiry = protocol.uintField(cmd, 'session_expiry', 0)
  const topicAliasMaximum = protocol.uintField(cmd, 'topic_alias_maximum', 0)
  const properties = {}
  if (sessionExpiry > 0) properties.sessionExpiryInterval = sessionExpiry
  if (topicAliasMaximum > 0) properties.topicAliasMaximum = topicAliasMaximum
  if (version === 4 && Object.keys(properties).length > 0) {
    throw new protocol.CommandError('session_expiry and topic_alias_maximum need version 5')
  }
  return Object.keys(properties).length > 0 ? properties : undefined
}

function clientOptions(cmd) {
  const version = protocol.field(cmd, 'version', '4 or 5', (v) => v === 4 || v === 5)
  const reconnect = protocol.boolField(cmd, 'reconnect', false)
  return {
    clientId: protocol.stringField(cmd, 'client_id'),
    protocolVersion: version,
    clean: protocol.boolField(cmd, 'clean', true),
    keepalive: protocol.uintField(cmd, 'keepalive', 60),
    username: protocol.stringField(cmd, 'username', null),
    password: protocol.stringField(cmd, 'password', null),
    properties: connectProperties(cmd, version),
    reconnectPeriod: reconnect ? RECONNECT_PERIOD_MS : 0,
    // The session (and its subscriptions) is the server's to keep: never subscribe again.
    resubscribe: false,
  }
}

async function connect(cmd, timeoutMs) {
  const url = protocol.stringField(cmd, 'url')
  if (!/^(mqtt|ws):\/\//.test(url)) throw protocol.badField('url', 'an mqtt:// or ws:// url', url)
  const options = clientOptions(cmd)
  if (connection) {
    // A connect replaces the connection before it, which the test no longer wants.
    const previous = connection
    connection = null
    await previous.end(true)
  }
  const attempt = new Connection(url, options)
  try {
    const sessionPresent = await withTimeout(attempt.ready, timeoutMs)
    connection = attempt
    return { session_present: sessionPresent }
  } catch (err) {
    // Dropped at once, so that neither this attempt nor the library's retries live on.
    attempt.end(false)
    throw err
  }
}

async function subscribe(cmd) {
  const conn = connected()
  const filter = protocol.stringField(cmd, 'filter')
  const options = { qos: protocol.qosField(cmd) }
  const subscriptionId = protocol.field(cmd, 'subscription_id', 'an integer 1-268435455',
    (v) => Number.isInteger(v) && v >= 1 && v <= 268435455, null)
  if (subscriptionId !== null) {
    if (conn.version !== 5) {
      throw new protocol.CommandError("field 'subscription_id' needs version 5")
    }
    options.properties = { subscriptionIdentifier: subscriptionId }
  }
  const suback = await new Promise((resolve, reject) => {
    // A SUBACK refusing the filter is an error to MQTT.js, with the SUBACK attached.
    conn.client.subscribe(filter, options, (err, _granted, packet) =>
      packet ? resolve(packet) : reject(err),
    )
  })
  return { granted: suback.granted }
}

async function unsubscribe(cmd) {
  const conn = connected()
  const filter = protocol.stringField(cmd, 'filter')
  await new Promise((resolve, reject) => {
    conn.client.unsubscribe(filter, (err) => (err ? reject(err) : resolve()))
  })
  return {}
}

// The Topic Alias to publish with, if any: MQTT.js lets its caller send an empty topic with an
// alias the current network connection has already set.
function publishTarget(conn, topic, properties) {
  const alias = properties.topic_alias
  if (alias === undefined || alias === null) return { topic, properties: {} }
  if (!Number.isInteger(alias) || alias < 1 || alias > 0xffff) {
    throw protocol.badField('topic_alias', 'an integer 1-65535', alias)
  }
  // MQTT.js refuses an alias above the server's maximum, but at QoS 1 and 2 drops its own error
  // (the publish never completes): refuse it here, with the library's words.
  const maximum = conn.client.serverProperties?.topicAliasMaximum ?? 0
  if (alias > maximum) {
    const limit = `the server's Topic Alias Maximum ${maximum}`
    throw new protocol.CommandError(`Sending Topic Alias out of range: ${alias} is above ${limit}`)
  }
  return { topic: conn.topicForAlias(topic, alias), properties: { topicAlias: alias } }
}

async function publish(cmd) {
  const conn = connected()
  const topic = protocol.stringField(cmd, 'topic')
  const payload = Buffer.from(protocol.stringField(cmd, 'payload', ''), 'utf8')
  const properties = protocol.field(cmd, 'properties', 'an object', protocol.isObject, {})
  if (conn.version !== 5 && Object.keys(properties).length > 0) {
    throw new protocol.CommandError("field 'properties' needs version 5")
  }
  const options = { qos: protocol.qosField(cmd), retain: protocol.boolField(cmd, 'retain', false) }
  const encoded = protocol.encodeProperties(properties)
  const target = publishTarget(conn, topic, properties)
  if (Object.keys(properties).length > 0) options.properties = { ...encoded, ...target.properties }
  await new Promise((resolve, reject) => {
    // The callback comes once written (QoS 0), on PUBACK (1) or on PUBCOMP (2).
    conn.client.publish(target.topic, payload, options, (err) => (err ? reject(err) : resolve()))
  })
  return {}
}

async function endConnection(graceful) {
  const conn = connected()
  connection = null
  await conn.end(graceful)
  return {}
}

const COMMANDS = {
  connect,
  subscribe,
  unsubscribe,
  publish,
  disconnect: () => endConnection(true),
  close: () => endConnection(false),
  exit: async () => {
    exitRequested = true
    return {}
  },
}

// -- the command loop ----------------------------------------------------------------------------

function withTimeout(promise, timeoutMs) {
  let timer
  const timeout = new Promise((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error('timeout')), timeoutMs)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

function parseCommand(line) {
  let cmd
  try {
    cmd = JSON.parse(line)
  } catch (err) {
    throw new protocol.CommandError(`not a JSON command: ${err.message}`)
  }
  if (!protocol.isObject(cmd)) throw new protocol.CommandError('a command must be a JSON object')
  return cmd
}

// Checks the fields every command has; returns how long the command may take.
function checkCommand(cmd) {
  protocol.field(cmd, 'id', 'an integer', Number.isInteger)
  if (!Object.hasOwn(COMMANDS, cmd.op)) {
    throw new protocol.CommandError(`unknown op ${JSON.stringify(cmd.op ?? null)}`)
  }
  const isTimeout = (v) => Number.isInteger(v) && v > 0
  return protocol.field(cmd, 'timeout_ms', 'a positive integer', isTimeout, DEFAULT_TIMEOUT_MS)
}

// The result line of one command line.
async function run(line) {
  let id = null
  try {
    const cmd = parseCommand(line)
    if (Number.isInteger(cmd.id)) id = cmd.id
    const timeoutMs = checkCommand(cmd)
    const result = await withTimeout(COMMANDS[cmd.op](cmd, timeoutMs), timeoutMs)
    return { id, ok: true, ...result }
  } catch (err) {
    return { id, ok: false, error: protocol.describeError(err) }
  }
}

async function main() {
  // The reader of our stdout is gone: nobody is left to answer.
  process.stdout.on('error', () => process.exit(0))
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity })
  for await (const line of lines) {
    if (line.trim() === '') continue
    const result = await run(line)
    protocol.send(result)
    if (exitRequested) break
  }
  // Also at the end of stdin; exit() drops a connection still open without DISCONNECT.
  process.exit(0)
}

main()
