//! MQTT 5.0 through rumqttc's `v5` client.

use crate::command::{ConnectParams, PublishParams, SubscribeParams};
use crate::properties;
use crate::session::{self, valid_filter, valid_topic, Progress, Requests, Session};
use crate::tracker::Acknowledgement;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, PubAckReason, PubCompReason, PubRecReason, Publish, SubscribeProperties, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ClientError, Event, Incoming, MqttOptions, Request};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// rumqttc's v5 options panic on a shorter keep alive (and cannot leave it off).
const MIN_KEEPALIVE: u16 = 5;

pub async fn connect(params: &ConnectParams, timeout: Duration) -> Result<(Session, bool), String> {
    let options = options(params)?;
    let (client, event_loop) = AsyncClient::new(options, session::REQUEST_QUEUE);
    let aliases = Arc::new(Mutex::new(Aliases::default()));
    let client = Client { client, aliases: aliases.clone() };
    let event_loop = EventLoop { inner: event_loop, aliases, server_aliases: HashMap::new() };
    Session::start(Box::new(client), event_loop, params.reconnect, timeout).await
}

fn options(params: &ConnectParams) -> Result<MqttOptions, String> {
    if params.keepalive < MIN_KEEPALIVE {
        let keepalive = params.keepalive;
        return Err(format!("field 'keepalive': rumqttc's v5 client takes {MIN_KEEPALIVE} s or more, not {keepalive}"));
    }
    let mut options = MqttOptions::new(&params.client_id, &params.host, params.port);
    options
        .set_keep_alive(Duration::from_secs(params.keepalive.into()))
        .set_clean_start(params.clean)
        // rumqttc takes its limit on incoming packets from the Maximum Packet Size it sends.
        .set_max_packet_size(Some(session::MAX_PACKET as u32))
        .set_outgoing_inflight_upper_limit(session::INFLIGHT);
    if params.session_expiry > 0 {
        options.set_session_expiry_interval(Some(params.session_expiry));
    }
    if params.topic_alias_maximum > 0 {
        options.set_topic_alias_max(Some(params.topic_alias_maximum));
    }
    if params.username.is_some() || params.password.is_some() {
        // rumqttc leaves an empty user name or password out of CONNECT.
        options
            .set_credentials(params.username.clone().unwrap_or_default(), params.password.clone().unwrap_or_default());
    }
    Ok(options)
}

/// The topic aliases the driver sends on the current network connection; a reconnect starts over.
#[derive(Default)]
struct Aliases {
    /// The server's Topic Alias Maximum from CONNACK. rumqttc drops the connection when asked to
    /// send a higher alias, so the driver refuses the publish before.
    maximum: u16,
    topics: HashMap<u16, String>,
}

impl Aliases {
    /// The topic to send with `alias`: empty once the server has been told what it stands for.
    fn topic_to_send(&self, alias: u16, topic: &str) -> Result<String, String> {
        if alias > self.maximum {
            let maximum = self.maximum;
            return Err(format!(
                "publish property 'topic_alias': {alias} is above the server's Topic Alias Maximum {maximum}"
            ));
        }
        let known = self.topics.get(&alias).is_some_and(|known| known == topic);
        Ok(if known { String::new() } else { topic.to_string() })
    }
}

struct Client {
    client: AsyncClient,
    aliases: Arc<Mutex<Aliases>>,
}

impl Requests for Client {
    /// rumqttc lets its caller manage topic aliases: the first publish with an alias carries the
    /// topic, later ones with the same alias an empty topic. (A publish queued while the connection
    /// is down goes out on the next one, whose server may not know the alias yet: the scenarios
    /// do not publish with aliases across a reconnect.)
    fn publish(&self, params: &PublishParams) -> Result<(), String> {
        valid_topic(&params.topic)?;
        let properties = properties::from_json(&params.properties)?;
        let alias = properties.topic_alias;
        let mut aliases = self.aliases.lock().expect("aliases lock");
        let topic = match alias {
            Some(alias) => aliases.topic_to_send(alias, &params.topic)?,
            None => params.topic.clone(),
        };
        let payload = params.payload.clone().into_bytes();
        self.client
            .try_publish_with_properties(topic, qos(params.qos)?, params.retain, payload, properties)
            .map_err(refused)?;
        if let Some(alias) = alias {
            aliases.topics.insert(alias, params.topic.clone());
        }
        Ok(())
    }

    fn subscribe(&self, params: &SubscribeParams) -> Result<(), String> {
        valid_filter(&params.filter)?;
        let qos = qos(params.qos)?;
        let queued = match params.subscription_id {
            Some(id) => {
                let properties = SubscribeProperties { id: Some(id), user_properties: Vec::new() };
                self.client.try_subscribe_with_properties(&params.filter, qos, properties)
            }
            None => self.client.try_subscribe(&params.filter, qos),
        };
        queued.map_err(refused)
    }

    fn unsubscribe(&self, filter: &str) -> Result<(), String> {
        self.client.try_unsubscribe(filter).map_err(refused)
    }

    fn disconnect(&self) -> Result<(), String> {
        self.client.try_disconnect().map_err(refused)
    }
}

fn refused(error: ClientError) -> String {
    format!("rumqttc's request queue is full or closed: {error}")
}

fn qos(qos: u8) -> Result<QoS, String> {
    rumqttc::v5::mqttbytes::qos(qos).ok_or_else(|| format!("field 'qos': {qos} is not a QoS"))
}

struct EventLoop {
    inner: rumqttc::v5::EventLoop,
    aliases: Arc<Mutex<Aliases>>,
    /// The topics of the aliases the server sends on this network connection. rumqttc resolves
    /// them too, but only after it has queued the event: a PUBLISH that came with the alias alone
    /// reaches the driver with an empty topic, which it looks up here.
    server_aliases: HashMap<u16, String>,
}

impl session::EventLoop for EventLoop {
    async fn poll(&mut self) -> Result<Progress, String> {
        let event = self.inner.poll().await.map_err(|error| error.to_string())?;
        Ok(match event {
            Event::Outgoing(outgoing) => Progress::outgoing(outgoing),
            Event::Incoming(Incoming::ConnAck(connack)) => self.connected(&connack),
            Event::Incoming(Incoming::Publish(publish)) => Progress::Message(self.message(publish)),
            Event::Incoming(Incoming::PubAck(ack)) => {
                Progress::Acked(Acknowledgement::PubAck { pkid: ack.pkid, code: puback_code(ack.reason) })
            }
            Event::Incoming(Incoming::PubRec(ack)) => {
                Progress::Acked(Acknowledgement::PubRec { pkid: ack.pkid, code: pubrec_code(ack.reason) })
            }
            Event::Incoming(Incoming::PubComp(ack)) => {
                Progress::Acked(Acknowledgement::PubComp { pkid: ack.pkid, code: pubcomp_code(ack.reason) })
            }
            Event::Incoming(Incoming::SubAck(ack)) => {
                let granted = ack.return_codes.iter().map(|code| suback_code(*code)).collect();
                Progress::Acked(Acknowledgement::SubAck { pkid: ack.pkid, granted })
            }
            Event::Incoming(Incoming::UnsubAck(ack)) => Progress::Acked(Acknowledgement::UnsubAck { pkid: ack.pkid }),
            _ => Progress::Nothing,
        })
    }

    fn queued(&self) -> usize {
        // A publish rumqttc has written has its packet id (QoS 1 and 2); SUBSCRIBE and
        // UNSUBSCRIBE are queued again only when never written.
        let unwritten = |request: &&Request| match request {
            Request::Publish(publish) => publish.pkid == 0,
            Request::Subscribe(_) | Request::Unsubscribe(_) => true,
            _ => false,
        };
        self.inner.pending.iter().filter(unwritten).count()
    }
}

impl EventLoop {
    /// A new network connection: topic aliases start over, both ways.
    fn connected(&mut self, connack: &ConnAck) -> Progress {
        let maximum = connack.properties.as_ref().and_then(|properties| properties.topic_alias_max);
        *self.aliases.lock().expect("aliases lock") = Aliases { maximum: maximum.unwrap_or(0), topics: HashMap::new() };
        self.server_aliases.clear();
        Progress::Connected { session_present: connack.session_present }
    }

    fn message(&mut self, publish: Publish) -> Map<String, Value> {
        let properties = publish.properties.unwrap_or_default();
        let topic = self.full_topic(String::from_utf8_lossy(&publish.topic).into_owned(), properties.topic_alias);
        let mut message = Map::new();
        message.insert("topic".into(), topic.into());
        // The protocol's payloads are UTF-8 text.
        message.insert("payload".into(), String::from_utf8_lossy(&publish.payload).into());
        message.insert("qos".into(), (publish.qos as u8).into());
        message.insert("retain".into(), publish.retain.into());
        message.insert("properties".into(), properties::to_json(&properties).into());
        message
    }

    /// The message's topic, also when the server sent its alias alone (see `server_aliases`).
    fn full_topic(&mut self, topic: String, alias: Option<u16>) -> String {
        match alias {
            None => topic,
            Some(alias) if topic.is_empty() => self.server_aliases.get(&alias).cloned().unwrap_or_else(|| {
                eprintln!("rumqttc driver: the server sent topic alias {alias} before telling its topic");
                topic
            }),
            Some(alias) => {
                self.server_aliases.insert(alias, topic.clone());
                topic
            }
        }
    }
}

// rumqttc keeps the numeric reason codes private: MQTT 5.0's tables.

fn puback_code(reason: PubAckReason) -> u8 {
    match reason {
        PubAckReason::Success => 0x00,
        PubAckReason::NoMatchingSubscribers => 0x10,
        PubAckReason::UnspecifiedError => 0x80,
        PubAckReason::ImplementationSpecificError => 0x83,
        PubAckReason::NotAuthorized => 0x87,
        PubAckReason::TopicNameInvalid => 0x90,
        PubAckReason::PacketIdentifierInUse => 0x91,
        PubAckReason::QuotaExceeded => 0x97,
        PubAckReason::PayloadFormatInvalid => 0x99,
    }
}

fn pubrec_code(reason: PubRecReason) -> u8 {
    match reason {
        PubRecReason::Success => 0x00,
        PubRecReason::NoMatchingSubscribers => 0x10,
        PubRecReason::UnspecifiedError => 0x80,
        PubRecReason::ImplementationSpecificError => 0x83,
        PubRecReason::NotAuthorized => 0x87,
        PubRecReason::TopicNameInvalid => 0x90,
        PubRecReason::PacketIdentifierInUse => 0x91,
        PubRecReason::QuotaExceeded => 0x97,
        PubRecReason::PayloadFormatInvalid => 0x99,
    }
}

fn pubcomp_code(reason: PubCompReason) -> u8 {
    match reason {
        PubCompReason::Success => 0x00,
        PubCompReason::PacketIdentifierNotFound => 0x92,
    }
}

fn suback_code(code: SubscribeReasonCode) -> u8 {
    match code {
        SubscribeReasonCode::Success(qos) => qos as u8,
        SubscribeReasonCode::Failure | SubscribeReasonCode::Unspecified => 0x80,
        SubscribeReasonCode::ImplementationSpecific => 0x83,
        SubscribeReasonCode::NotAuthorized => 0x87,
        SubscribeReasonCode::TopicFilterInvalid => 0x8F,
        SubscribeReasonCode::PkidInUse => 0x91,
        SubscribeReasonCode::QuotaExceeded => 0x97,
        SubscribeReasonCode::SharedSubscriptionsNotSupported => 0x9E,
        SubscribeReasonCode::SubscriptionIdNotSupported => 0xA1,
        SubscribeReasonCode::WildcardSubscriptionsNotSupported => 0xA2,
    }
}
