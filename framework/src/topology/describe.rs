//! Seeing a topology: its node graph as the DSL builds it, and
//! [`TopologyDescription`], the text (in the spirit of Kafka Streams'
//! `TopologyDescription`) and Mermaid renderings of it.
//!
//! Every operator adds one node to the builder's [`Graph`], named as Kafka Streams names
//! it: an operator prefix and a counter shared by the whole topology
//! (`KSTREAM-SOURCE-0000000000`, `KSTREAM-FILTER-0000000001`, ...). A node knows its
//! parents; children, sub-topologies and the rendering are derived when described.
//!
//! Sub-topologies are the connected parts of the graph, as in Kafka Streams: nodes are
//! connected by their edges and by the state stores they share. A repartition topic
//! (a sink node, and a source node reading the same topic) separates two sub-topologies.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A node of the topology graph: its index in [`Graph`].
pub(crate) type NodeId = usize;

/// What a node of a topology is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// Reads records from topics.
    Source {
        /// The topics it reads.
        topics: Vec<String>,
    },
    /// Transforms, filters, aggregates or consumes records.
    Processor {
        /// The state stores it uses (empty for a stateless operator).
        stores: Vec<String>,
    },
    /// Produces records to a topic.
    Sink {
        /// The topic it writes to.
        topic: String,
    },
}

#[derive(Debug, Clone)]
struct GraphNode {
    name: String,
    kind: NodeKind,
    parents: Vec<NodeId>,
}

/// The node graph a [`StreamsBuilder`](crate::StreamsBuilder) builds, one node per operator.
#[derive(Debug, Default)]
pub(crate) struct Graph {
    nodes: Vec<GraphNode>,
    /// The node a grouped stream reads from (set by `group_by` / `group_by_key`), the
    /// parent of the aggregation nodes added through the line-based [`Graph::push`].
    grouped_parent: Option<NodeId>,
    /// The last node added through [`Graph::push`] that owns a store: the parent of a
    /// table stream made by `KStream::new`.
    table_parent: Option<NodeId>,
}

impl Graph {
    /// Adds a node named `<prefix>-<counter, 10 digits>` (Kafka Streams' naming, e.g.
    /// `add_node("KSTREAM-FILTER", ...)` gives `KSTREAM-FILTER-0000000003`) and returns it.
    pub(crate) fn add_node(&mut self, prefix: &str, kind: NodeKind, parents: &[NodeId]) -> NodeId {
        let name = format!("{prefix}-{:010}", self.nodes.len());
        self.add_named_node(name, kind, parents)
    }

    /// Adds a node with a name chosen by the caller (it should be unique in the topology).
    pub(crate) fn add_named_node(
        &mut self,
        name: String,
        kind: NodeKind,
        parents: &[NodeId],
    ) -> NodeId {
        let parents = parents
            .iter()
            .copied()
            .filter(|&p| p < self.nodes.len())
            .collect();
        self.nodes.push(GraphNode {
            name,
            kind,
            parents,
        });
        self.nodes.len() - 1
    }

    /// The name of a node (empty for an unknown id).
    pub(crate) fn name(&self, node: NodeId) -> &str {
        self.nodes.get(node).map_or("", |n| n.name.as_str())
    }

    /// How many nodes the graph has (node ids are `0..len()`).
    pub(crate) fn is_sink(&self, node: NodeId) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| matches!(n.kind, NodeKind::Sink { .. }))
    }

    /// The number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The parents of `node` (empty for an unknown id).
    pub(crate) fn parents(&self, node: NodeId) -> &[NodeId] {
        self.nodes.get(node).map_or(&[], |n| n.parents.as_slice())
    }

    /// The node a grouped stream made now reads from (see [`Graph::set_grouped_parent`]).
    pub(crate) fn grouped_parent(&self) -> Option<NodeId> {
        self.grouped_parent
    }

    /// The topics of the sources upstream of `node` (itself included).
    pub(crate) fn source_topics(&self, node: NodeId) -> BTreeSet<String> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![node];
        let mut topics = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if n >= self.nodes.len() || std::mem::replace(&mut seen[n], true) {
                continue;
            }
            if let NodeKind::Source { topics: read } = &self.nodes[n].kind {
                topics.extend(read.iter().cloned());
            }
            stack.extend(self.nodes[n].parents.iter().copied());
        }
        topics
    }

    /// The nodes that have `node` as a parent.
    fn children(&self, node: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).filter(move |&n| self.nodes[n].parents.contains(&node))
    }

    /// The stores of the processors reading from `node`, in the order they were added.
    pub(crate) fn child_stores(&self, node: NodeId) -> Vec<String> {
        self.children(node)
            .filter_map(|n| match &self.nodes[n].kind {
                NodeKind::Processor { stores } => Some(stores.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Whether a sink is downstream of `node`.
    pub(crate) fn reaches_sink(&self, node: NodeId) -> bool {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            for child in self.children(n) {
                if matches!(self.nodes[child].kind, NodeKind::Sink { .. }) {
                    return true;
                }
                if !std::mem::replace(&mut seen[child], true) {
                    stack.push(child);
                }
            }
        }
        false
    }

    /// Moves the processors reading from `from` to read from `to` instead (sinks stay).
    pub(crate) fn reparent(&mut self, from: NodeId, to: NodeId) {
        for node in &mut self.nodes {
            if matches!(node.kind, NodeKind::Processor { .. }) {
                for parent in &mut node.parents {
                    if *parent == from {
                        *parent = to;
                    }
                }
            }
        }
    }

    /// Moves the nodes before `before` (processors and sinks) that read from any of `from`
    /// to read from `to` instead, each parent once.
    pub(crate) fn reparent_all(&mut self, from: &[NodeId], to: &[NodeId], before: NodeId) {
        for node in self.nodes.iter_mut().take(before) {
            if node.parents.iter().any(|p| from.contains(p)) {
                let mut parents: Vec<NodeId> = Vec::new();
                for &parent in &node.parents {
                    let moved: &[NodeId] = if from.contains(&parent) {
                        to
                    } else {
                        &[parent]
                    };
                    for &p in moved {
                        if !parents.contains(&p) {
                            parents.push(p);
                        }
                    }
                }
                node.parents = parents;
            }
        }
    }

    /// Records which node a grouped stream's aggregations will read from.
    pub(crate) fn set_grouped_parent(&mut self, node: NodeId) {
        self.grouped_parent = Some(node);
    }

    /// The node a table stream made without an explicit parent hangs from.
    pub(crate) fn table_parent(&self) -> Option<NodeId> {
        self.table_parent
    }

    /// Adds a node from a line of the walking skeleton's text description
    /// (`"Source: t"`, `"Processor: count (store: s)"`, `"Sink: t"`), reading from
    /// `parent` (`None`: the grouped parent, or the last node), and returns it. New code
    /// calls [`Graph::add_node`] with explicit parents.
    pub(crate) fn push_from(&mut self, line: String, parent: Option<NodeId>) -> NodeId {
        let line = line.trim();
        let parents: Vec<NodeId> = parent
            .or(self.grouped_parent)
            .or_else(|| self.nodes.len().checked_sub(1))
            .into_iter()
            .collect();
        if let Some(topic) = line.strip_prefix("Source: ") {
            let topics = vec![topic.to_owned()];
            self.add_node("KSTREAM-SOURCE", NodeKind::Source { topics }, &[])
        } else if let Some(topic) = line.strip_prefix("Sink: ") {
            let topic = topic.to_owned();
            self.add_node("KSTREAM-SINK", NodeKind::Sink { topic }, &parents)
        } else {
            let what = line.strip_prefix("Processor: ").unwrap_or(line);
            let (op, rest) = what.split_once(' ').unwrap_or((what, ""));
            let stores: Vec<String> = rest
                .split_once("store: ")
                .map(|(_, s)| s.trim_end_matches(')').to_owned())
                .into_iter()
                .collect();
            let prefix = match op {
                "count" | "reduce" | "aggregate" => "KSTREAM-AGGREGATE".to_owned(),
                other => format!("KSTREAM-{}", other.to_uppercase()),
            };
            let owns_store = !stores.is_empty();
            let node = self.add_node(&prefix, NodeKind::Processor { stores }, &parents);
            if owns_store {
                self.table_parent = Some(node);
            }
            node
        }
    }

    /// The description of the graph: sub-topologies, nodes with their neighbours.
    pub(crate) fn describe(&self) -> TopologyDescription {
        let components = self.components();
        let mut children: Vec<Vec<NodeId>> = vec![Vec::new(); self.nodes.len()];
        for (id, node) in self.nodes.iter().enumerate() {
            for &p in &node.parents {
                children[p].push(id);
            }
        }
        let mut groups: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
        for (id, &component) in components.iter().enumerate() {
            groups.entry(component).or_default().push(id);
        }
        let names = |ids: &[NodeId]| ids.iter().map(|&i| self.nodes[i].name.clone()).collect();
        let sub_topologies = groups
            .into_values()
            .enumerate()
            .map(|(index, ids)| SubTopology {
                id: index,
                nodes: ids
                    .iter()
                    .map(|&id| Node {
                        name: self.nodes[id].name.clone(),
                        kind: self.nodes[id].kind.clone(),
                        predecessors: names(&self.nodes[id].parents),
                        successors: names(&children[id]),
                    })
                    .collect(),
            })
            .collect();
        TopologyDescription { sub_topologies }
    }

    /// For each node, the smallest node id of its sub-topology (union-find over the
    /// edges and the stores nodes share).
    fn components(&self) -> Vec<NodeId> {
        let mut root: Vec<NodeId> = (0..self.nodes.len()).collect();
        fn find(root: &mut [NodeId], mut x: NodeId) -> NodeId {
            while root[x] != x {
                root[x] = root[root[x]];
                x = root[x];
            }
            x
        }
        let union = |root: &mut Vec<NodeId>, a: NodeId, b: NodeId| {
            let (ra, rb) = (find(root, a), find(root, b));
            let (lo, hi) = (ra.min(rb), ra.max(rb));
            root[hi] = lo;
        };
        let mut store_owner: BTreeMap<&str, NodeId> = BTreeMap::new();
        for (id, node) in self.nodes.iter().enumerate() {
            for &p in &node.parents {
                union(&mut root, id, p);
            }
            if let NodeKind::Processor { stores } = &node.kind {
                for store in stores {
                    let owner = *store_owner.entry(store.as_str()).or_insert(id);
                    union(&mut root, id, owner);
                }
            }
        }
        (0..self.nodes.len())
            .map(|id| find(&mut root, id))
            .collect()
    }
}

/// The shape of a topology, as [`Topology::describe`](super::Topology::describe) returns it:
/// its sub-topologies and their nodes. `Display` writes the text form of Kafka Streams'
/// `TopologyDescription`; [`to_mermaid`](Self::to_mermaid) a Mermaid diagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyDescription {
    /// The connected parts of the topology, numbered from 0 in the order of their first node.
    pub sub_topologies: Vec<SubTopology>,
}

/// A connected part of a topology: nodes linked by edges or by a shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubTopology {
    /// Its number.
    pub id: usize,
    /// Its nodes, in the order they were declared.
    pub nodes: Vec<Node>,
}

/// One node of a topology description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The node's name, e.g. `KSTREAM-FILTER-0000000001`.
    pub name: String,
    /// Source, processor or sink, with its topics or stores.
    pub kind: NodeKind,
    /// The names of the nodes it reads from.
    pub predecessors: Vec<String>,
    /// The names of the nodes it sends records to.
    pub successors: Vec<String>,
}

impl TopologyDescription {
    /// Every node, across sub-topologies.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.sub_topologies.iter().flat_map(|s| s.nodes.iter())
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes().find(|n| n.name == name)
    }

    /// A Mermaid `graph TD` diagram: one subgraph per sub-topology, topics as
    /// parallelograms, sources as stadiums, processors as boxes, stores as cylinders
    /// (linked to their processors by dotted lines).
    pub fn to_mermaid(&self) -> String {
        let mut ids: BTreeMap<&str, String> = BTreeMap::new();
        for (i, node) in self.nodes().enumerate() {
            ids.insert(node.name.as_str(), format!("n{i}"));
        }
        let mut topics: BTreeMap<&str, String> = BTreeMap::new();
        let mut stores: BTreeMap<&str, String> = BTreeMap::new();
        for node in self.nodes() {
            match &node.kind {
                NodeKind::Source { topics: ts } => ts.iter().for_each(|t| {
                    let next = format!("t{}", topics.len());
                    topics.entry(t.as_str()).or_insert(next);
                }),
                NodeKind::Sink { topic } => {
                    let next = format!("t{}", topics.len());
                    topics.entry(topic.as_str()).or_insert(next);
                }
                NodeKind::Processor { stores: ss } => ss.iter().for_each(|s| {
                    let next = format!("s{}", stores.len());
                    stores.entry(s.as_str()).or_insert(next);
                }),
            }
        }
        let mut out = String::from("graph TD\n");
        for (topic, id) in &topics {
            out += &format!("  {id}[/\"{}\"/]\n", mermaid_label(topic));
        }
        for sub in &self.sub_topologies {
            out += &format!("  subgraph sub{0}[\"Sub-topology {0}\"]\n", sub.id);
            for node in &sub.nodes {
                let (id, label) = (&ids[node.name.as_str()], mermaid_label(&node.name));
                out += &match node.kind {
                    NodeKind::Source { .. } => format!("    {id}([\"{label}\"])\n"),
                    NodeKind::Processor { .. } => format!("    {id}[\"{label}\"]\n"),
                    NodeKind::Sink { .. } => format!("    {id}[[\"{label}\"]]\n"),
                };
            }
            out += "  end\n";
        }
        for (store, id) in &stores {
            out += &format!("  {id}[(\"{}\")]\n", mermaid_label(store));
        }
        for node in self.nodes() {
            let id = &ids[node.name.as_str()];
            match &node.kind {
                NodeKind::Source { topics: ts } => {
                    for t in ts {
                        out += &format!("  {} --> {id}\n", topics[t.as_str()]);
                    }
                }
                NodeKind::Sink { topic } => {
                    out += &format!("  {id} --> {}\n", topics[topic.as_str()]);
                }
                NodeKind::Processor { stores: ss } => {
                    for s in ss {
                        out += &format!("  {id} -.- {}\n", stores[s.as_str()]);
                    }
                }
            }
            for child in &node.successors {
                if let Some(child) = ids.get(child.as_str()) {
                    out += &format!("  {id} --> {child}\n");
                }
            }
        }
        out
    }
}

/// Escapes a label for a quoted Mermaid label.
fn mermaid_label(text: &str) -> String {
    text.replace('"', "#quot;")
}

impl fmt::Display for TopologyDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Topologies:")?;
        for (i, sub) in self.sub_topologies.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "   Sub-topology: {}", sub.id)?;
            for node in &sub.nodes {
                match &node.kind {
                    NodeKind::Source { topics } => writeln!(
                        f,
                        "    Source: {} (topics: [{}])",
                        node.name,
                        topics.join(", ")
                    )?,
                    NodeKind::Processor { stores } => writeln!(
                        f,
                        "    Processor: {} (stores: [{}])",
                        node.name,
                        stores.join(", ")
                    )?,
                    NodeKind::Sink { topic } => {
                        writeln!(f, "    Sink: {} (topic: {topic})", node.name)?
                    }
                }
                if !matches!(node.kind, NodeKind::Sink { .. }) {
                    let successors = if node.successors.is_empty() {
                        "none".to_owned()
                    } else {
                        node.successors.join(", ")
                    };
                    writeln!(f, "      --> {successors}")?;
                }
                if !node.predecessors.is_empty() {
                    writeln!(f, "      <-- {}", node.predecessors.join(", "))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor() -> NodeKind {
        NodeKind::Processor { stores: vec![] }
    }

    #[test]
    fn names_count_across_node_kinds() {
        let mut g = Graph::default();
        let s = g.add_node(
            "KSTREAM-SOURCE",
            NodeKind::Source {
                topics: vec!["in".into()],
            },
            &[],
        );
        let f = g.add_node("KSTREAM-FILTER", processor(), &[s]);
        assert_eq!(g.name(s), "KSTREAM-SOURCE-0000000000");
        assert_eq!(g.name(f), "KSTREAM-FILTER-0000000001");
    }

    #[test]
    fn repartition_topic_splits_sub_topologies_and_shared_store_joins_them() {
        let mut g = Graph::default();
        let src = |t: &str| NodeKind::Source {
            topics: vec![t.into()],
        };
        let a = g.add_node("KSTREAM-SOURCE", src("in"), &[]);
        g.add_node(
            "KSTREAM-SINK",
            NodeKind::Sink {
                topic: "rep".into(),
            },
            &[a],
        );
        let b = g.add_node("KSTREAM-SOURCE", src("rep"), &[]);
        let agg = NodeKind::Processor {
            stores: vec!["st".into()],
        };
        g.add_node("KSTREAM-AGGREGATE", agg.clone(), &[b]);
        let c = g.add_node("KSTREAM-SOURCE", src("other"), &[]);
        g.add_node("KSTREAM-AGGREGATE", agg, &[c]);
        let d = g.describe();
        let ids: Vec<Vec<&str>> = d
            .sub_topologies
            .iter()
            .map(|s| s.nodes.iter().map(|n| n.name.as_str()).collect())
            .collect();
        assert_eq!(
            ids,
            vec![
                vec!["KSTREAM-SOURCE-0000000000", "KSTREAM-SINK-0000000001"],
                vec![
                    "KSTREAM-SOURCE-0000000002",
                    "KSTREAM-AGGREGATE-0000000003",
                    "KSTREAM-SOURCE-0000000004",
                    "KSTREAM-AGGREGATE-0000000005"
                ],
            ]
        );
    }

    #[test]
    fn text_form_is_kafka_streams_like() {
        let mut g = Graph::default();
        let s = g.add_node(
            "KSTREAM-SOURCE",
            NodeKind::Source {
                topics: vec!["in".into()],
            },
            &[],
        );
        let f = g.add_node("KSTREAM-FILTER", processor(), &[s]);
        g.add_node(
            "KSTREAM-SINK",
            NodeKind::Sink {
                topic: "out".into(),
            },
            &[f],
        );
        let expected = "Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [in])
      --> KSTREAM-FILTER-0000000001
    Processor: KSTREAM-FILTER-0000000001 (stores: [])
      --> KSTREAM-SINK-0000000002
      <-- KSTREAM-SOURCE-0000000000
    Sink: KSTREAM-SINK-0000000002 (topic: out)
      <-- KSTREAM-FILTER-0000000001
";
        assert_eq!(g.describe().to_string(), expected);
        let mermaid = "graph TD
  t0[/\"in\"/]
  t1[/\"out\"/]
  subgraph sub0[\"Sub-topology 0\"]
    n0([\"KSTREAM-SOURCE-0000000000\"])
    n1[\"KSTREAM-FILTER-0000000001\"]
    n2[[\"KSTREAM-SINK-0000000002\"]]
  end
  t0 --> n0
  n0 --> n1
  n1 --> n2
  n2 --> t1
";
        assert_eq!(g.describe().to_mermaid(), mermaid);
    }

    #[test]
    fn legacy_lines_hang_from_the_grouped_parent() {
        let mut g = Graph::default();
        g.push_from("Source: in".into(), None);
        let key = g.add_node("KSTREAM-KEY-SELECT", processor(), &[0]);
        g.set_grouped_parent(key);
        g.push_from("  Processor: count (store: counts)".into(), None);
        let d = g.describe();
        let count = d.node("KSTREAM-AGGREGATE-0000000002").unwrap();
        assert_eq!(
            count.kind,
            NodeKind::Processor {
                stores: vec!["counts".into()]
            }
        );
        assert_eq!(count.predecessors, vec!["KSTREAM-KEY-SELECT-0000000001"]);
        assert_eq!(g.table_parent(), Some(2));
    }
}
