//! MQTT 3.1.1 through rumqttc's top-level client.

use crate::command::{ConnectParams, PublishParams, SubscribeParams};
use crate::session::{self, valid_filter, valid_topic, Progress, Requests, Session};
use crate::tracker::Acknowledgement;
use rumqttc::{AsyncClient, ClientError, Event, Incoming, MqttOptions, QoS, Request, SubscribeReasonCode};
use serde_json::{Map, Value};
use std::time::Duration;

pub async fn connect(params: &ConnectParams, timeout: Duration) -> Result<(Session, bool), String> {
    let options = options(params)?;
    let (client, event_loop) = AsyncClient::new(options, session::REQUEST_QUEUE);
    Session::start(Box::new(Client(client)), EventLoop(event_loop), params.reconnect, timeout).await
}

fn options(params: &ConnectParams) -> Result<MqttOptions, String> {
    if params.session_expiry != 0 || params.topic_alias_maximum != 0 {
        return Err("fields 'session_expiry' and 'topic_alias_maximum' are MQTT 5.0 only".into());
    }
    if !params.clean && params.client_id.is_empty() {
        // rumqttc panics on this combination.
        return Err("field 'client_id': rumqttc needs one for a persistent session (clean=false)".into());
    }
    let mut options = MqttOptions::new(&params.client_id, &params.host, params.port);
    options
        .set_keep_alive(Duration::from_secs(params.keepalive.into()))
        .set_clean_session(params.clean)
        .set_max_packet_size(session::MAX_PACKET, session::MAX_PACKET)
        .set_inflight(session::INFLIGHT);
    if params.username.is_some() || params.password.is_some() {
        // rumqttc leaves an empty user name or password out of CONNECT.
        options
            .set_credentials(params.username.clone().unwrap_or_default(), params.password.clone().unwrap_or_default());
    }
    Ok(options)
}

struct Client(AsyncClient);

impl Requests for Client {
    fn publish(&self, params: &PublishParams) -> Result<(), String> {
        if !params.properties.is_empty() {
            return Err("field 'properties': MQTT 5.0 only".into());
        }
        valid_topic(&params.topic)?;
        let payload = params.payload.clone().into_bytes();
        self.0.try_publish(&params.topic, qos(params.qos)?, params.retain, payload).map_err(refused)
    }

    fn subscribe(&self, params: &SubscribeParams) -> Result<(), String> {
        if params.subscription_id.is_some() {
            return Err("field 'subscription_id': MQTT 5.0 only".into());
        }
        valid_filter(&params.filter)?;
        self.0.try_subscribe(&params.filter, qos(params.qos)?).map_err(refused)
    }

    fn unsubscribe(&self, filter: &str) -> Result<(), String> {
        self.0.try_unsubscribe(filter).map_err(refused)
    }

    fn disconnect(&self) -> Result<(), String> {
        self.0.try_disconnect().map_err(refused)
    }
}

fn refused(error: ClientError) -> String {
    format!("rumqttc's request queue is full or closed: {error}")
}

struct EventLoop(rumqttc::EventLoop);

impl session::EventLoop for EventLoop {
    async fn poll(&mut self) -> Result<Progress, String> {
        match self.0.poll().await {
            Ok(event) => Ok(progress(event)),
            Err(error) => Err(error.to_string()),
        }
    }

    fn queued(&self) -> usize {
        // A publish rumqttc has written has its packet id (QoS 1 and 2); SUBSCRIBE and
        // UNSUBSCRIBE are queued again only when never written.
        let unwritten = |request: &&Request| match request {
            Request::Publish(publish) => publish.pkid == 0,
            Request::Subscribe(_) | Request::Unsubscribe(_) => true,
            _ => false,
        };
        self.0.pending.iter().filter(unwritten).count()
    }
}

fn progress(event: Event) -> Progress {
    match event {
        Event::Outgoing(outgoing) => Progress::outgoing(outgoing),
        Event::Incoming(Incoming::ConnAck(connack)) => Progress::Connected { session_present: connack.session_present },
        Event::Incoming(Incoming::Publish(publish)) => Progress::Message(message(publish)),
        Event::Incoming(Incoming::PubAck(ack)) => Progress::Acked(Acknowledgement::PubAck { pkid: ack.pkid, code: 0 }),
        Event::Incoming(Incoming::PubRec(ack)) => Progress::Acked(Acknowledgement::PubRec { pkid: ack.pkid, code: 0 }),
        Event::Incoming(Incoming::PubComp(ack)) => {
            Progress::Acked(Acknowledgement::PubComp { pkid: ack.pkid, code: 0 })
        }
        Event::Incoming(Incoming::SubAck(ack)) => {
            let granted = ack.return_codes.iter().map(|code| granted(*code)).collect();
            Progress::Acked(Acknowledgement::SubAck { pkid: ack.pkid, granted })
        }
        Event::Incoming(Incoming::UnsubAck(ack)) => Progress::Acked(Acknowledgement::UnsubAck { pkid: ack.pkid }),
        _ => Progress::Nothing,
    }
}

fn message(publish: rumqttc::Publish) -> Map<String, Value> {
    let mut message = Map::new();
    message.insert("topic".into(), publish.topic.into());
    // The protocol's payloads are UTF-8 text.
    message.insert("payload".into(), String::from_utf8_lossy(&publish.payload).into());
    message.insert("qos".into(), (publish.qos as u8).into());
    message.insert("retain".into(), publish.retain.into());
    message
}

fn granted(code: SubscribeReasonCode) -> u8 {
    match code {
        SubscribeReasonCode::Success(qos) => qos as u8,
        SubscribeReasonCode::Failure => 0x80,
    }
}

fn qos(qos: u8) -> Result<QoS, String> {
    rumqttc::qos(qos).map_err(|error| format!("field 'qos': {error}"))
}
