'use strict'
// The driver's MQTT.js client and the protocol events it gives.

const mqtt = require('mqtt')
const { send, describeError, decodeProperties } = require('./protocol')

// One MQTT.js client, from a connect command to its disconnect or close: its events become
// protocol events, and `ready` settles with the first CONNACK.
class Connection {
  constructor(url, options) {
    this.version = options.protocolVersion
    this.closing = false // the test asked for the end: it is not a lost connection
    this.established = false
    this.lost = false
    this.lastError = null
    // Topic Alias -> topic, as last sent on the current network connection.
    this.sentAliases = new Map()
    if (this.version === 5) options.customHandleAcks = keepResolvedTopic
    this.client = mqtt.connect(url, options)
    this.ready = new Promise((resolve, reject) => {
      // Not the 'connect' event: after a reconnect MQTT.js emits it only once the publishes it
      // kept have been acknowledged, long after the CONNACK and the first messages.
      this.client.on('packetreceive', (packet) => {
        if (packet.cmd === 'connack') this.onConnack(packet, resolve)
      })
      this.client.on('close', () => this.onClose(reject))
      this.client.on('error', (err) => this.onError(err, reject))
    })
    this.client.on('disconnect', (packet) => {
      this.lastError = `the server sent DISCONNECT with reason code ${packet.reasonCode}`
    })
    this.client.on('message', (topic, payload, packet) => this.onMessage(topic, payload, packet))
  }

  onConnack(connack, resolve) {
    // A refusal comes as an 'error' event too.
    if ((connack.reasonCode ?? connack.returnCode) !== 0) return
    // Topic Aliases belong to one network connection.
    this.sentAliases.clear()
    const sessionPresent = connack.sessionPresent === true
    if (!this.established) {
      this.established = true
      resolve(sessionPresent)
    } else if (this.lost && !this.closing) {
      this.lost = false
      send({ event: 'reconnected', session_present: sessionPresent })
    }
  }

  // MQTT.js reports some causes as an 'error' event before the close (a refusing CONNACK, a
  // refused TCP connection, a keepalive timeout), none for others (the server's EOF, an HTTP
  // error status of a WebSocket upgrade).
  onClose(reject) {
    const reason = this.lastError
    this.lastError = null
    if (!this.established) {
      reject(new Error(reason || 'the connection was closed before a CONNACK'))
    } else if (!this.lost && !this.closing) {
      // Once per loss: the failed attempts of the library's reconnect close again.
      this.lost = true
      send({ event: 'connection_lost', error: reason || 'the connection was closed' })
    }
  }

  onError(err, reject) {
    this.lastError = describeError(err)
    if (!this.established) reject(err)
  }

  onMessage(topic, payload, packet) {
    const event = {
      event: 'message',
      topic,
      payload: payload.toString('utf8'),
      qos: packet.qos,
      retain: packet.retain,
    }
    if (this.version === 5) event.properties = decodeProperties(packet.properties)
    send(event)
  }

  // The topic to put in a PUBLISH with `alias`: empty once the alias stands for it.
  topicForAlias(topic, alias) {
    if (this.sentAliases.get(alias) === topic) return ''
    this.sentAliases.set(alias, topic)
    return topic
  }

  // Ends the client for good (the library does not reconnect): with a DISCONNECT if `graceful`
  // and connected, else by dropping the socket (MQTT.js would only queue the DISCONNECT).
  end(graceful) {
    this.closing = true
    const { client } = this
    const force = !graceful || !client.connected
    if (!force) {
      // What is still in flight belongs to commands that timed out already (they run one at a
      // time): MQTT.js would hold the DISCONNECT back until the server acknowledges it.
      for (const id of Object.keys(client.outgoing)) client.removeOutgoingMessage(Number(id))
    }
    return new Promise((resolve) => client.end(force, {}, () => resolve()))
  }
}

// MQTT.js resolves a received Topic Alias before this hook, but hands a QoS 2 message to the
// application from the stored PUBLISH, whose topic is still the empty one the server sent with
// the alias: store the resolved topic instead. Accepts every message (reason code 0), as
// MQTT.js does without the hook.
function keepResolvedTopic(topic, payload, packet, done) {
  packet.topic = topic
  done(null, 0)
}

module.exports = { Connection }
