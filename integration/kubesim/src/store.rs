//! The object store: every object as JSON under `(storage key, namespace, name)`, one
//! cluster-wide monotonic resourceVersion, the bounded history of changes that watches replay
//! from (older versions are "compacted": a watch from them gets 410 Expired), and the broadcast
//! of new changes to open watches. Knows nothing about HTTP, auth or validation.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::catalog::StorageKey;

/// ADDED / MODIFIED / DELETED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change (what a watch turns into an event).
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub kind: ChangeKind,
    pub storage: StorageKey,
    pub namespace: String,
    pub name: String,
    /// The object after the change (for DELETED: the last state, with the deletion's rv).
    pub object: Value,
    /// The object before the change (MODIFIED only): lets a filtered watch turn a change that
    /// leaves its selector into DELETED and one that enters it into ADDED.
    pub old: Option<Value>,
}

/// The history no longer reaches back to the asked resourceVersion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too old resource version: {asked} ({oldest})")]
pub struct Expired {
    pub asked: u64,
    /// The oldest resourceVersion a watch may still start from.
    pub oldest: u64,
}

type Objects = BTreeMap<(String, String), Value>;

#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<StorageKey, Objects>,
    history: VecDeque<Arc<Change>>,
    history_capacity: usize,
    /// Changes with rv <= compacted are gone from the history.
    compacted: u64,
    tx: broadcast::Sender<Arc<Change>>,
}

impl Store {
    pub fn new(history_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_capacity: history_capacity.max(1),
            compacted: 1,
            tx,
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, key: &StorageKey, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(key)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Objects in key order (namespace, name), optionally one namespace only.
    pub fn list<'a>(
        &'a self,
        key: &StorageKey,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .get(key)
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(move |((n, _), _)| ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
    }

    /// Commits a create/update/delete: stamps the new resourceVersion into the object, records
    /// it in the history and tells open watches. Returns the stored object.
    pub fn commit(
        &mut self,
        key: &StorageKey,
        ns: &str,
        name: &str,
        kind: ChangeKind,
        mut object: Value,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let map = self.objects.entry(key.clone()).or_default();
        let id = (ns.to_string(), name.to_string());
        let old = match kind {
            ChangeKind::Deleted => map.remove(&id),
            _ => map.insert(id, object.clone()),
        };
        let change = Arc::new(Change {
            rv,
            kind,
            storage: key.clone(),
            namespace: ns.into(),
            name: name.into(),
            object: object.clone(),
            old: if kind == ChangeKind::Modified {
                old
            } else {
                None
            },
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_capacity {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
        let _ = self.tx.send(change);
        object
    }

    /// Changes after `rv`, or `Expired` when the history no longer reaches back that far.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<Change>>, Expired> {
        if rv < self.compacted {
            return Err(Expired {
                asked: rv,
                oldest: self.compacted,
            });
        }
        Ok(self.history.iter().filter(|c| c.rv > rv).cloned().collect())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.tx.subscribe()
    }

    /// Forgets the whole history: every watch from an earlier resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    pub fn set_history_capacity(&mut self, n: usize) {
        self.history_capacity = n.max(1);
        while self.history.len() > self.history_capacity {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
    }

    pub fn oldest_watchable(&self) -> u64 {
        self.compacted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn history_is_bounded_and_expires() {
        let k = StorageKey::new("", "configmaps");
        let mut s = Store::new(3);
        let start = s.rv();
        for i in 0..5 {
            s.commit(
                &k,
                "default",
                &format!("c{i}"),
                ChangeKind::Added,
                json!({"metadata": {}}),
            );
        }
        assert_eq!(s.rv(), start + 5);
        assert!(s.since(start).is_err());
        let tail = s.since(start + 2).unwrap();
        assert_eq!(
            tail.iter().map(|c| c.rv).collect::<Vec<_>>(),
            vec![start + 3, start + 4, start + 5]
        );
        s.compact();
        assert!(s.since(start + 4).is_err());
        assert!(s.since(s.rv()).unwrap().is_empty());
    }
}
