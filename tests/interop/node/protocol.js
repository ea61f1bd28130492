'use strict'
// The driver protocol's side of tests/interop/README.md: results and events written to stdout,
// the fields of a command checked, and properties between the protocol's keys and MQTT.js's.
//
// Node runs the driver on one thread and writes to a pipe synchronously, so every line written
// by send() reaches stdout whole and at once: no further serialisation is needed.

class CommandError extends Error {}

function send(line) {
  process.stdout.write(`${JSON.stringify(line)}\n`)
}

function describeError(err) {
  // MQTT.js gives a refusing CONNACK/PUBACK/PUBREC's reason code as a number in `code`.
  if (typeof err.code === 'number') {
    return `${err.message} (reason code ${err.code} = 0x${err.code.toString(16)})`
  }
  return err.message || String(err)
}

// -- fields of a command -------------------------------------------------------------------------

function badField(name, expected, value) {
  return new CommandError(`field '${name}' must be ${expected}, got ${JSON.stringify(value)}`)
}

const REQUIRED = Symbol('required')

// A field's value checked by `isValid`; `fallback` when absent or null, unless REQUIRED.
function field(cmd, name, expected, isValid, fallback = REQUIRED) {
  const value = cmd[name]
  if (value === undefined || value === null) {
    if (fallback === REQUIRED) throw new CommandError(`field '${name}' is missing`)
    return fallback
  }
  if (!isValid(value)) throw badField(name, expected, value)
  return value
}

const isString = (v) => typeof v === 'string'
const isBool = (v) => typeof v === 'boolean'
const isUint = (v) => Number.isInteger(v) && v >= 0
const isQos = (v) => v === 0 || v === 1 || v === 2

const stringField = (cmd, name, fallback) => field(cmd, name, 'a string', isString, fallback)
const boolField = (cmd, name, fallback) => field(cmd, name, 'true or false', isBool, fallback)
const uintField = (cmd, name, fallback) =>
  field(cmd, name, 'a non-negative integer', isUint, fallback)
const qosField = (cmd) => field(cmd, 'qos', '0, 1 or 2', isQos, 0)

function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

// -- properties: the protocol's snake_case keys <-> MQTT.js's camelCase ones ---------------------

// MQTT.js keeps user properties in an object whose value is an array for a repeated key: the
// repeats keep their order, but pairs of different keys come out grouped by key (in first-seen
// order, except that JavaScript puts integer-like keys first), both when sent and received.
function encodeUserProperties(pairs) {
  const isPair = (p) => Array.isArray(p) && p.length === 2 && p.every(isString)
  if (!Array.isArray(pairs) || !pairs.every(isPair)) {
    throw badField('user_properties', 'a list of [key, value] string pairs', pairs)
  }
  const grouped = Object.create(null)
  for (const [key, value] of pairs) {
    grouped[key] = key in grouped ? [].concat(grouped[key], value) : value
  }
  return grouped
}

function decodeUserProperties(grouped) {
  return Object.keys(grouped).flatMap((key) => [].concat(grouped[key]).map((v) => [key, v]))
}

function encodeHex(hex) {
  if (!isString(hex) || !/^([0-9a-fA-F]{2})*$/.test(hex)) {
    throw badField('correlation_data', 'hex digits', hex)
  }
  return Buffer.from(hex, 'hex')
}

// A property whose value crosses over unchanged once it passed `isValid`.
function plain(key, mqttName, expected, isValid) {
  const encode = (value) => {
    if (!isValid(value)) throw badField(key, expected, value)
    return value
  }
  return { mqttName, encode, decode: (value) => value }
}

// Per protocol key: the MQTT.js property name and how a value crosses over each way. Topic
// Alias is not here: publish() sends it (its own way) and a received one is reported as is.
const PROPERTIES = {
  user_properties: {
    mqttName: 'userProperties',
    encode: encodeUserProperties,
    decode: decodeUserProperties,
  },
  response_topic: plain('response_topic', 'responseTopic', 'a string', isString),
  correlation_data: {
    mqttName: 'correlationData',
    encode: encodeHex,
    decode: (buffer) => buffer.toString('hex'),
  },
  content_type: plain('content_type', 'contentType', 'a string', isString),
  payload_format: {
    // MQTT.js has the Payload Format Indicator as a boolean.
    mqttName: 'payloadFormatIndicator',
    encode: (value) => {
      if (value !== 0 && value !== 1) throw badField('payload_format', '0 or 1', value)
      return value === 1
    },
    decode: (flag) => (flag ? 1 : 0),
  },
  message_expiry: plain('message_expiry', 'messageExpiryInterval', 'whole seconds', isUint),
}

function encodeProperties(properties) {
  const encoded = {}
  for (const [key, value] of Object.entries(properties)) {
    if (key === 'topic_alias' || value === null) continue
    if (!Object.hasOwn(PROPERTIES, key)) throw new CommandError(`unknown property '${key}'`)
    encoded[PROPERTIES[key].mqttName] = PROPERTIES[key].encode(value)
  }
  return encoded
}

function decodeProperties(received = {}) {
  const decoded = {}
  for (const [key, { mqttName, decode }] of Object.entries(PROPERTIES)) {
    if (received[mqttName] !== undefined) decoded[key] = decode(received[mqttName])
  }
  // One Subscription Identifier comes as a number, several as an array.
  if (received.subscriptionIdentifier !== undefined) {
    decoded.subscription_ids = [].concat(received.subscriptionIdentifier)
  }
  if (received.topicAlias !== undefined) decoded.topic_alias = received.topicAlias
  return decoded
}

module.exports = {
  CommandError,
  send,
  describeError,
  badField,
  field,
  isObject,
  stringField,
  boolField,
  uintField,
  qosField,
  encodeProperties,
  decodeProperties,
}
