//! An in-memory Kafka transactional log, written from Kafka's documented semantics (not
//! from the code under test), shared by the exactly-once output tests:
//!
//! - transactional ids with epochs: `init_transactions` bumps the epoch (fencing older
//!   instances), aborts an ongoing transaction and waits while one is being completed
//!   (`CONCURRENT_TRANSACTIONS`); a coordinator timeout aborts and bumps the epoch;
//! - `EndTxn` returns once the transaction is *prepared*; its markers are written later,
//!   and the transactional offsets are materialised in the group after that (both when the
//!   test says, in any order across transactional ids); an `OffsetFetch` with
//!   `require_stable` waits while the partition has offsets pending; a transactional id's
//!   next transaction (or `init_transactions`) waits until its previous one is complete, its
//!   offsets materialised included (Kafka's coordinator answers `CONCURRENT_TRANSACTIONS`
//!   until every marker of the previous transaction, the offsets partition's too, is
//!   written), so one producer's offset commits are materialised in order;
//! - with a partitioner, the topics it partitions are read back per partition, and a
//!   `read_committed` fetch of a range returns the offsets of committed transactions,
//!   waiting while one in the range is open (the last stable offset).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lambda_streams::event::TopicPartition;
use lambda_streams::kafka::{CommittedOffset, TransactionalLog, TransactionalProducer, TxnError};
use lambda_streams::sink::OutputRecord;

/// Which partition a record of a topic goes to: `None` for topics not read back (their
/// records are outputs); `index` is the record's position among the topic's records (for
/// the round robin of null keys).
pub type Partitioner = Arc<dyn Fn(&OutputRecord, usize) -> Option<i32> + Send + Sync>;

pub type TxnKey = (String, i64, u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    Complete,
}

#[derive(Debug)]
pub struct Tid {
    pub epoch: i64,
    pub status: Status,
    pub current: Option<TxnKey>,
    pub seq: u64,
}

#[derive(Default)]
pub struct Log {
    /// Per topic: the records in log order, with their transaction.
    pub topics: BTreeMap<String, Vec<(OutputRecord, TxnKey)>>,
    /// Per transaction: `None` open, `Some(true)` committed, `Some(false)` aborted.
    pub txns: HashMap<TxnKey, Option<bool>>,
    pub tids: BTreeMap<String, Tid>,
    /// Per group and partition: the committed offset and its metadata.
    pub offsets: HashMap<(String, TopicPartition), CommittedOffset>,
    pub pending: HashMap<(String, TopicPartition), HashMap<TxnKey, CommittedOffset>>,
    /// Markers to write: (transactional id, transaction, commit).
    pub markers: Vec<(String, TxnKey, bool)>,
    /// Transactions whose marker is written and whose offsets are not materialised yet.
    pub to_materialise: Vec<(TxnKey, bool)>,
    pub fenced: u64,
    /// How the topics read back are partitioned (`None`: no topic is read back).
    pub partitioner: Option<Partitioner>,
    /// The coordinator completes the transactions a step waits on at once (every marker
    /// written, every offset materialised), for tests that drive invocations one by one;
    /// otherwise the test decides when (`deliver_marker`, `materialise`).
    pub auto_complete: bool,
}

pub enum Step<T> {
    Done(T),
    Blocked,
}

impl Log {
    pub fn end(&mut self, tid: &str, commit: bool) {
        let t = self.tids.get_mut(tid).unwrap();
        t.status = if commit {
            Status::PrepareCommit
        } else {
            Status::PrepareAbort
        };
        let key = t.current.clone().unwrap();
        self.markers.push((tid.to_owned(), key, commit));
    }

    pub fn init(&mut self, tid: &str) -> Step<i64> {
        let t = self.tids.entry(tid.to_owned()).or_insert(Tid {
            epoch: -1,
            status: Status::Empty,
            current: None,
            seq: 0,
        });
        let completing = self.to_materialise.iter().any(|(key, _)| key.0 == tid);
        match t.status {
            Status::PrepareCommit | Status::PrepareAbort => Step::Blocked,
            _ if completing => Step::Blocked,
            Status::Ongoing => {
                t.epoch += 1;
                self.end(tid, false);
                Step::Blocked
            }
            _ => {
                t.epoch += 1;
                t.status = Status::Empty;
                Step::Done(t.epoch)
            }
        }
    }

    /// The transaction `tid`@`epoch` writes in, started if none is ongoing.
    pub fn check(&mut self, tid: &str, epoch: i64) -> Result<Step<TxnKey>, TxnError> {
        let t = self.tids.get_mut(tid).unwrap();
        if t.epoch != epoch {
            self.fenced += 1;
            return Err(TxnError::fatal(format!(
                "{tid}: fenced (epoch {epoch} < {})",
                t.epoch
            )));
        }
        let completing = self.to_materialise.iter().any(|(key, _)| key.0 == tid);
        match t.status {
            Status::PrepareCommit | Status::PrepareAbort => Ok(Step::Blocked),
            Status::Ongoing => Ok(Step::Done(t.current.clone().unwrap())),
            _ if completing => Ok(Step::Blocked),
            _ => {
                t.seq += 1;
                let key = (tid.to_owned(), epoch, t.seq);
                t.current = Some(key.clone());
                t.status = Status::Ongoing;
                self.txns.insert(key.clone(), None);
                Ok(Step::Done(key))
            }
        }
    }

    pub fn deliver_marker(&mut self, i: usize) {
        let (tid, key, commit) = self.markers.remove(i);
        self.txns.insert(key.clone(), Some(commit));
        self.to_materialise.push((key.clone(), commit));
        let t = self.tids.get_mut(&tid).unwrap();
        if t.current.as_ref() == Some(&key) {
            t.status = Status::Complete;
        }
    }

    pub fn materialise(&mut self, i: usize) {
        let (key, commit) = self.to_materialise.remove(i);
        for (gtp, pending) in self.pending.iter_mut() {
            if let Some(offset) = pending.remove(&key)
                && commit
            {
                self.offsets.insert(gtp.clone(), offset);
            }
        }
    }

    /// With `auto_complete`: writes every marker and materialises every offset.
    fn complete_if_auto(&mut self) {
        if self.auto_complete {
            while !self.markers.is_empty() {
                self.deliver_marker(0);
            }
            while !self.to_materialise.is_empty() {
                self.materialise(0);
            }
        }
    }

    pub fn timeout_abort(&mut self, tid: &str) {
        self.tids.get_mut(tid).unwrap().epoch += 1;
        self.end(tid, false);
    }

    pub fn ongoing(&self) -> Vec<String> {
        self.tids
            .iter()
            .filter(|(_, t)| t.status == Status::Ongoing)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The records of partition `tp` in offset order, with their transactions (a topic the
    /// partitioner reads back).
    pub fn partition(&self, tp: &TopicPartition) -> Vec<(&OutputRecord, &TxnKey)> {
        let Some(partitioner) = &self.partitioner else {
            return Vec::new();
        };
        self.topics
            .get(tp.topic.as_str())
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(i, (r, _))| partitioner(r, *i) == Some(tp.partition))
            .map(|(_, (r, key))| (r, key))
            .collect()
    }

    /// What a `read_committed` reader of `topic` gets.
    pub fn committed_view(&self, topic: &str) -> Vec<&OutputRecord> {
        self.topics
            .get(topic)
            .into_iter()
            .flatten()
            .filter(|(_, key)| self.txns.get(key) == Some(&Some(true)))
            .map(|(r, _)| r)
            .collect()
    }
}

#[derive(Clone, Default)]
pub struct Broker(pub Arc<Mutex<Log>>);

impl Broker {
    pub fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.0.lock().unwrap()
    }

    /// Runs `step` until it is not blocked, yielding to the other tasks first and between
    /// attempts (every request is a point where a schedule can interleave or crash).
    /// A broker whose coordinator completes transactions as soon as a step waits on them.
    pub fn completing() -> Self {
        let broker = Broker::default();
        broker.log().auto_complete = true;
        broker
    }

    pub async fn run<T>(&self, mut step: impl FnMut(&mut Log) -> Step<T>) -> T {
        loop {
            tokio::task::yield_now().await;
            let mut log = self.log();
            if let Step::Done(t) = step(&mut log) {
                return t;
            }
            log.complete_if_auto();
        }
    }

    pub async fn run_checked<T>(
        &self,
        mut step: impl FnMut(&mut Log) -> Result<Step<T>, TxnError>,
    ) -> Result<T, TxnError> {
        loop {
            tokio::task::yield_now().await;
            let mut log = self.log();
            if let Step::Done(t) = step(&mut log)? {
                return Ok(t);
            }
            log.complete_if_auto();
        }
    }
}

pub struct MemoryProducer {
    pub broker: Broker,
    pub tid: String,
    pub epoch: i64,
}

#[async_trait]
impl TransactionalProducer for MemoryProducer {
    async fn begin(&self) -> Result<(), TxnError> {
        // librdkafka's begin_transaction is local; the transaction starts at its first write.
        Ok(())
    }

    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), TxnError> {
        let records = Mutex::new(Some(records));
        self.broker
            .run_checked(|log| {
                let Step::Done(key) = log.check(&self.tid, self.epoch)? else {
                    return Ok(Step::Blocked);
                };
                for record in records.lock().unwrap().take().unwrap() {
                    log.topics
                        .entry(record.topic.clone())
                        .or_default()
                        .push((record, key.clone()));
                }
                Ok(Step::Done(()))
            })
            .await
    }

    async fn send_offset(
        &self,
        group: &str,
        tp: &TopicPartition,
        next: i64,
        metadata: &str,
    ) -> Result<(), TxnError> {
        self.broker
            .run_checked(|log| {
                let Step::Done(key) = log.check(&self.tid, self.epoch)? else {
                    return Ok(Step::Blocked);
                };
                log.pending
                    .entry((group.to_owned(), tp.clone()))
                    .or_default()
                    .insert(
                        key,
                        CommittedOffset {
                            offset: next,
                            metadata: metadata.to_owned(),
                        },
                    );
                Ok(Step::Done(()))
            })
            .await
    }

    async fn commit(&self) -> Result<(), TxnError> {
        self.broker
            .run_checked(|log| {
                let t = &log.tids[&self.tid];
                if t.epoch != self.epoch {
                    log.fenced += 1;
                    return Err(TxnError::fatal(format!("{}: fenced at commit", self.tid)));
                }
                if t.status == Status::Ongoing {
                    log.end(&self.tid, true);
                }
                Ok(Step::Done(()))
            })
            .await
    }

    async fn abort(&self) -> Result<(), TxnError> {
        self.broker
            .run(|log| {
                let t = &log.tids[&self.tid];
                if t.epoch == self.epoch && t.status == Status::Ongoing {
                    log.end(&self.tid, false);
                }
                Step::Done(())
            })
            .await;
        Ok(())
    }
}

#[async_trait]
impl TransactionalLog for Broker {
    async fn producer(
        &self,
        transactional_id: &str,
    ) -> Result<Arc<dyn TransactionalProducer>, TxnError> {
        let epoch = self.run(|log| log.init(transactional_id)).await;
        Ok(Arc::new(MemoryProducer {
            broker: self.clone(),
            tid: transactional_id.to_owned(),
            epoch,
        }))
    }

    async fn read_committed(
        &self,
        tp: &TopicPartition,
        first: i64,
        last: i64,
    ) -> Result<Vec<i64>, TxnError> {
        Ok(self
            .run(|log| {
                let records = log.partition(tp);
                if records.is_empty() {
                    // Not written in transactions (an input topic).
                    return Step::Done((first..=last).collect());
                }
                let range = records
                    .iter()
                    .enumerate()
                    .filter(|(o, _)| (first..=last).contains(&(*o as i64)));
                let mut visible = Vec::new();
                for (offset, (_, key)) in range {
                    match log.txns.get(*key) {
                        // Open: the last stable offset is below it; the fetch waits.
                        None | Some(None) => return Step::Blocked,
                        Some(Some(true)) => visible.push(offset as i64),
                        Some(Some(false)) => {}
                    }
                }
                Step::Done(visible)
            })
            .await)
    }

    async fn committed(
        &self,
        group: &str,
        tps: &[TopicPartition],
    ) -> Result<Vec<Option<CommittedOffset>>, TxnError> {
        Ok(self
            .run(|log| {
                let unstable = tps.iter().any(|tp| {
                    log.pending
                        .get(&(group.to_owned(), tp.clone()))
                        .is_some_and(|p| !p.is_empty())
                });
                if unstable {
                    return Step::Blocked; // UNSTABLE_OFFSET_COMMIT: the client retries
                }
                Step::Done(
                    tps.iter()
                        .map(|tp| log.offsets.get(&(group.to_owned(), tp.clone())).cloned())
                        .collect(),
                )
            })
            .await)
    }
}
