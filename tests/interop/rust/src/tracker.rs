//! Which command waits for which packet. rumqttc gives a request its packet id only when it writes
//! the request out (`Outgoing::Publish(pkid)`, `Outgoing::Subscribe(pkid)`, ...), and the ack then
//! names that id. Requests are written in the order they were queued, so the commands waiting for
//! their request to be written form a queue; once written, they wait in a map by packet id.

use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use tokio::sync::oneshot;

/// A command's result: its fields besides id and ok, or the error.
pub type Reply = Result<Map<String, Value>, String>;

/// A request the driver hands to rumqttc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Publish { qos: u8 },
    Subscribe,
    Unsubscribe,
}

/// rumqttc wrote a request out, with this packet id (0 for QoS 0).
#[derive(Debug)]
pub enum Written {
    Publish(u16),
    Subscribe(u16),
    Unsubscribe(u16),
}

/// An acknowledgement from the server, with its reason code (always 0 in MQTT 3.1.1).
#[derive(Debug)]
pub enum Acknowledgement {
    PubAck { pkid: u16, code: u8 },
    PubRec { pkid: u16, code: u8 },
    PubComp { pkid: u16, code: u8 },
    SubAck { pkid: u16, granted: Vec<u8> },
    UnsubAck { pkid: u16 },
}

struct Waiter {
    kind: Kind,
    reply: oneshot::Sender<Reply>,
}

impl Waiter {
    fn answer(self, reply: Reply) {
        // The command may have timed out and gone: nobody to tell then.
        let _ = self.reply.send(reply);
    }
}

#[derive(Default)]
pub struct Tracker {
    /// Handed to rumqttc, not written out yet: in rumqttc's order.
    unwritten: VecDeque<Waiter>,
    /// Written out, waiting for the ack that completes them.
    unacked: HashMap<u16, Waiter>,
}

impl Tracker {
    /// The next request handed to rumqttc is `kind`. The caller queues that request while holding
    /// the tracker, so this queue's order is rumqttc's.
    pub fn expect(&mut self, kind: Kind) -> oneshot::Receiver<Reply> {
        let (reply, receiver) = oneshot::channel();
        self.unwritten.push_back(Waiter { kind, reply });
        receiver
    }

    pub fn written(&mut self, written: Written) {
        let pkid = match written {
            // A publish rumqttc sends again on a resumed session keeps its packet id.
            Written::Publish(pkid) if self.unacked.contains_key(&pkid) => return,
            Written::Publish(pkid) | Written::Subscribe(pkid) | Written::Unsubscribe(pkid) => pkid,
        };
        if !self.unwritten.front().is_some_and(|waiter| same_request(waiter.kind, &written)) {
            eprintln!("rumqttc driver: rumqttc wrote {written:?}, which no command waits for");
            return;
        }
        let Some(waiter) = self.unwritten.pop_front() else { return };
        match waiter.kind {
            Kind::Publish { qos: 0 } => waiter.answer(Ok(Map::new())),
            _ => {
                self.unacked.insert(pkid, waiter);
            }
        }
    }

    pub fn acked(&mut self, ack: Acknowledgement) {
        match ack {
            Acknowledgement::PubAck { pkid, code } => self.finish(pkid, checked("PUBACK", code)),
            Acknowledgement::PubRec { pkid, code } if code >= 0x80 => self.finish(pkid, checked("PUBREC", code)),
            Acknowledgement::PubRec { .. } => {} // QoS 2 goes on to PUBCOMP.
            Acknowledgement::PubComp { pkid, code } => self.finish(pkid, checked("PUBCOMP", code)),
            Acknowledgement::SubAck { pkid, granted } => {
                let mut fields = Map::new();
                fields.insert("granted".into(), granted.into());
                self.finish(pkid, Ok(fields));
            }
            Acknowledgement::UnsubAck { pkid } => self.finish(pkid, Ok(Map::new())),
        }
    }

    /// The connection ended. rumqttc sends unacknowledged publishes again on a resumed session, but
    /// not a SUBSCRIBE or UNSUBSCRIBE: those will never be acknowledged.
    pub fn connection_lost(&mut self, error: &str) {
        let orphans = self.unacked.extract_if(|_, waiter| !matches!(waiter.kind, Kind::Publish { .. }));
        for (_, waiter) in orphans {
            waiter.answer(Err(format!("connection lost before the ack (rumqttc does not send it again): {error}")));
        }
    }

    /// rumqttc reconnected without the session and dropped what it kept for it: the publishes
    /// awaiting their ack, and the `queued` oldest requests that it had not written yet.
    pub fn session_not_resumed(&mut self, queued: usize) {
        const DROPPED: &str = "rumqttc dropped the request: the reconnect did not resume the session";
        let queued = queued.min(self.unwritten.len());
        for waiter in self.unwritten.drain(..queued) {
            waiter.answer(Err(DROPPED.into()));
        }
        for (_, waiter) in self.unacked.drain() {
            waiter.answer(Err(DROPPED.into()));
        }
    }

    /// The connection is over for good: nothing in flight will complete.
    pub fn fail_all(&mut self, error: &str) {
        let waiters = self.unwritten.drain(..).chain(self.unacked.drain().map(|(_, waiter)| waiter));
        for waiter in waiters {
            waiter.answer(Err(error.to_string()));
        }
    }

    fn finish(&mut self, pkid: u16, reply: Reply) {
        match self.unacked.remove(&pkid) {
            Some(waiter) => waiter.answer(reply),
            None => eprintln!("rumqttc driver: an ack for packet id {pkid}, which no command waits for"),
        }
    }
}

fn same_request(kind: Kind, written: &Written) -> bool {
    matches!(
        (kind, written),
        (Kind::Publish { .. }, Written::Publish(_))
            | (Kind::Subscribe, Written::Subscribe(_))
            | (Kind::Unsubscribe, Written::Unsubscribe(_))
    )
}

/// A reason code of 0x80 or above fails the publish (MQTT 5.0); below, it went through.
fn checked(packet: &str, code: u8) -> Reply {
    if code >= 0x80 {
        Err(format!("{packet} reason code {code} (0x{code:02x})"))
    } else {
        Ok(Map::new())
    }
}
