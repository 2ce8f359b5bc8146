//! The nodes of an executable graph as [`crate::msg::GraphInstantiate`] carries them in its bulk
//! tail: one after another, in a topological order of the graph, each
//!
//! ```text
//! offset size field
//!      0    2 opcode   a request opcode (LaunchKernel, MemcpyDtoD, Memset, EventRecord,
//!                      StreamWaitEvent), MEM_ALLOC_NODE / MEM_FREE_NODE / EMPTY_NODE,
//!                      or DEPS_NODE (the dependencies of the next node)
//!      2    4 len      bytes of the node's payload that follow
//!      6  len payload  the request's fields (and bulk tail: a launch's packed parameters),
//!                      exactly as that request would carry them on its own
//! ```
//!
//! A node depends on the node before it, unless a [`DEPS_NODE`] comes first: its payload is the
//! list of the nodes the next node depends on (`u32` indices into the list of nodes, pseudo-nodes
//! not counted, each smaller than the next node's own index; an empty list makes it a root). The
//! host replays the nodes through the same path as the ordinary request each stands for (its `ctx`
//! and `stream` fields replaced by the launch's), after the work before the launch on the launch
//! stream and before the work after it there; nodes that do not depend on each other (directly or
//! through others) may run at the same time, as independent branches of a CUDA graph do.
//!
//! A [`CONDITIONAL_NODE`] carries its body graphs in its tail, each a node list of this same
//! format (nested conditional nodes included, at most [`MAX_CONDITIONAL_DEPTH`] deep); when the
//! launch reaches the node, its handle's value, set by the launch's kernels with
//! `cudaGraphSetConditional`, chooses the body that runs ([`conditional::chosen`]).

use thiserror::Error;

use crate::msg::{Message, Op};

/// Opcode of a [`crate::msg::GraphMemAllocNode`] inside a graph (not a request of its own).
pub const MEM_ALLOC_NODE: u16 = 0x09f0;
/// Opcode of a [`crate::msg::GraphMemFreeNode`] inside a graph (not a request of its own).
pub const MEM_FREE_NODE: u16 = 0x09f1;
/// Opcode of a join point inside a graph (empty payload): a node that does nothing but wait for
/// its dependencies.
pub const EMPTY_NODE: u16 = 0x09f3;
/// Opcode of a dependency list inside a graph: the dependencies of the node that follows.
pub const DEPS_NODE: u16 = 0x09f2;
/// Opcode of a [`crate::msg::GraphConditionalNode`] inside a graph: a conditional node and, in
/// its tail, its body graphs (see [`split_bodies`]).
pub const CONDITIONAL_NODE: u16 = 0x09f4;
/// Most levels of conditional nodes inside conditional bodies.
pub const MAX_CONDITIONAL_DEPTH: usize = 8;
/// Most body graphs one conditional node may have (a switch's cases).
pub const MAX_CONDITIONAL_BODIES: u32 = 1024;

/// CUDA's conditional node types (`CUgraphConditionalNodeType`) and handle flags.
pub mod conditional {
    /// `CU_GRAPH_COND_TYPE_IF`: body 0 runs when the value is not 0, body 1 (if any) when it is.
    pub const IF: u32 = 0;
    /// `CU_GRAPH_COND_TYPE_WHILE`: body 0 runs again and again while the value is not 0.
    pub const WHILE: u32 = 1;
    /// `CU_GRAPH_COND_TYPE_SWITCH` (CUDA 12.8): body `n` runs when the value is `n`.
    pub const SWITCH: u32 = 2;
    /// `CU_GRAPH_COND_ASSIGN_DEFAULT`: the handle takes its default value at each launch.
    pub const ASSIGN_DEFAULT: u32 = 1;

    /// Whether `bodies` body graphs suit a node of `kind` (CUDA: a while loop has one, an if
    /// one or two, a switch at least one).
    pub fn valid(kind: u32, bodies: u32) -> bool {
        match kind {
            IF => matches!(bodies, 1 | 2),
            WHILE => bodies == 1,
            SWITCH => (1..=super::MAX_CONDITIONAL_BODIES).contains(&bodies),
            _ => false,
        }
    }

    /// The body a node of `kind` runs next when its handle's value is `value` (`None`: none; a
    /// while loop then ends).
    pub fn chosen(kind: u32, bodies: u32, value: u32) -> Option<u32> {
        match kind {
            IF if value != 0 => Some(0),
            IF if bodies == 2 => Some(1),
            WHILE if value != 0 => Some(0),
            SWITCH if value < bodies => Some(value),
            _ => None,
        }
    }
}

/// Splits the tail of a conditional node into its `count` body graphs' node lists (each a `u32`
/// length and that many bytes); refuses a tail that does not hold exactly `count` of them.
pub fn split_bodies(mut tail: &[u8], count: u32) -> Result<Vec<&[u8]>, NodeListError> {
    let mut bodies = Vec::new();
    for index in 0..count as usize {
        let Some((len, rest)) = tail.split_first_chunk::<4>() else {
            return Err(NodeListError::BadBody { index });
        };
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(NodeListError::BadBody { index });
        }
        bodies.push(&rest[..len]);
        tail = &rest[len..];
    }
    if !tail.is_empty() {
        return Err(NodeListError::BadBody {
            index: count as usize,
        });
    }
    Ok(bodies)
}

/// Appends a body graph's node list to a conditional node's tail.
pub fn push_body(tail: &mut Vec<u8>, nodes: &[u8]) {
    tail.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
    tail.extend_from_slice(nodes);
}
/// Most nodes one executable graph may hold (dependency lists not counted).
pub const MAX_GRAPH_NODES: usize = 1 << 16;
/// Bytes before each node's payload.
pub const NODE_HEADER_LEN: usize = 6;

/// Why a graph's node list is malformed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NodeListError {
    /// The list ended inside a node.
    #[error("graph node {index} is truncated")]
    Truncated {
        /// Position of the node in the list.
        index: usize,
    },
    /// More nodes than [`MAX_GRAPH_NODES`].
    #[error("a graph holds at most {MAX_GRAPH_NODES} nodes")]
    TooManyNodes,
    /// A dependency list that is not followed by a node, or whose length is not a multiple of 4.
    #[error("graph node {index}: a dependency list must be whole u32 indices followed by a node")]
    BadDeps {
        /// Position of the node the list is for.
        index: usize,
    },
    /// A conditional node's tail that is not its bodies' node lists.
    #[error("conditional body {index} is truncated or not announced")]
    BadBody {
        /// Position of the body.
        index: usize,
    },
    /// A dependency on the node itself or on a later one.
    #[error("graph node {index} depends on node {dep}, which is not before it")]
    ForwardDep {
        /// Position of the node.
        index: usize,
        /// The dependency named.
        dep: u32,
    },
}

/// One node of a list: its opcode and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeBytes<'a> {
    /// Request opcode, or [`MEM_ALLOC_NODE`] / [`MEM_FREE_NODE`].
    pub opcode: u16,
    /// The request's payload (fields, then its bulk tail).
    pub payload: &'a [u8],
}

/// Appends a node with opcode `opcode` and the encoded `fields` followed by `tail`.
pub fn push_node<M: Message>(out: &mut Vec<u8>, opcode: u16, fields: &M, tail: &[u8]) {
    let mut payload = Vec::new();
    fields.encode(&mut payload);
    payload.extend_from_slice(tail);
    out.extend_from_slice(&opcode.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// Appends request `req` (with bulk tail `tail`) as a node.
pub fn push_op<O: Op>(out: &mut Vec<u8>, req: &O, tail: &[u8]) {
    push_node(out, O::OPCODE, req, tail);
}

/// Appends a dependency list for the node appended next: the indices of the nodes it depends on.
pub fn push_deps(out: &mut Vec<u8>, deps: &[u32]) {
    out.extend_from_slice(&DEPS_NODE.to_le_bytes());
    out.extend_from_slice(&((deps.len() * 4) as u32).to_le_bytes());
    for d in deps {
        out.extend_from_slice(&d.to_le_bytes());
    }
}

/// A node and the nodes it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode<'a> {
    /// The node.
    pub node: NodeBytes<'a>,
    /// Indices of the nodes it depends on (each smaller than its own), sorted, no duplicates.
    pub deps: Vec<u32>,
}

/// Splits a node list and resolves its dependency lists ([`DEPS_NODE`]); refuses truncated
/// nodes, lists longer than [`MAX_GRAPH_NODES`], malformed dependency lists and dependencies
/// that are not on earlier nodes.
pub fn split_graph(bytes: &[u8]) -> Result<Vec<GraphNode<'_>>, NodeListError> {
    let mut out: Vec<GraphNode<'_>> = Vec::new();
    let mut pending: Option<Vec<u32>> = None;
    for n in split_nodes(bytes)? {
        let index = out.len();
        if n.opcode == DEPS_NODE {
            if pending.is_some() || !n.payload.len().is_multiple_of(4) {
                return Err(NodeListError::BadDeps { index });
            }
            let mut deps = Vec::with_capacity(n.payload.len() / 4);
            for c in n.payload.chunks_exact(4) {
                let dep = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if dep as usize >= index {
                    return Err(NodeListError::ForwardDep { index, dep });
                }
                deps.push(dep);
            }
            deps.sort_unstable();
            deps.dedup();
            pending = Some(deps);
            continue;
        }
        let deps = pending.take().unwrap_or_else(|| match index {
            0 => Vec::new(),
            i => vec![(i - 1) as u32],
        });
        out.push(GraphNode { node: n, deps });
    }
    if pending.is_some() {
        return Err(NodeListError::BadDeps { index: out.len() });
    }
    Ok(out)
}

/// Splits a node list; refuses truncated nodes and lists longer than [`MAX_GRAPH_NODES`]
/// (dependency lists, [`DEPS_NODE`], are returned as nodes but not counted: each must precede a
/// node, see [`split_graph`]).
pub fn split_nodes(mut bytes: &[u8]) -> Result<Vec<NodeBytes<'_>>, NodeListError> {
    let mut nodes = Vec::new();
    let mut counted = 0usize;
    let mut deps_run = 0usize;
    while !bytes.is_empty() {
        let index = counted;
        if index == MAX_GRAPH_NODES || deps_run > 1 {
            return Err(if deps_run > 1 {
                NodeListError::BadDeps { index }
            } else {
                NodeListError::TooManyNodes
            });
        }
        if bytes.len() < NODE_HEADER_LEN {
            return Err(NodeListError::Truncated { index });
        }
        let opcode = u16::from_le_bytes([bytes[0], bytes[1]]);
        let len = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as usize;
        let rest = &bytes[NODE_HEADER_LEN..];
        if rest.len() < len {
            return Err(NodeListError::Truncated { index });
        }
        if opcode == DEPS_NODE {
            deps_run += 1;
        } else {
            counted += 1;
            deps_run = 0;
        }
        nodes.push(NodeBytes {
            opcode,
            payload: &rest[..len],
        });
        bytes = &rest[len..];
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{self, Request};

    #[test]
    fn conditional_bodies_round_trip_and_malformed_tails_are_refused() {
        let mut tail = Vec::new();
        push_body(&mut tail, &[1, 2, 3]);
        push_body(&mut tail, &[]);
        assert_eq!(
            split_bodies(&tail, 2).unwrap(),
            vec![&[1u8, 2, 3][..], &[][..]]
        );
        // One body fewer or more than announced, or a length past the end.
        assert_eq!(
            split_bodies(&tail, 1),
            Err(NodeListError::BadBody { index: 1 })
        );
        assert_eq!(
            split_bodies(&tail, 3),
            Err(NodeListError::BadBody { index: 2 })
        );
        let mut long = Vec::new();
        long.extend_from_slice(&100u32.to_le_bytes());
        long.extend_from_slice(&[0; 8]);
        assert_eq!(
            split_bodies(&long, 1),
            Err(NodeListError::BadBody { index: 0 })
        );
    }

    #[test]
    fn a_conditional_node_chooses_its_body_as_cuda_does() {
        use conditional::{IF, SWITCH, WHILE, chosen, valid};
        assert_eq!(chosen(IF, 1, 7), Some(0));
        assert_eq!(chosen(IF, 1, 0), None);
        assert_eq!(chosen(IF, 2, 0), Some(1), "the else body");
        assert_eq!(chosen(WHILE, 1, 1), Some(0));
        assert_eq!(chosen(WHILE, 1, 0), None);
        assert_eq!(chosen(SWITCH, 3, 2), Some(2));
        assert_eq!(
            chosen(SWITCH, 3, 3),
            None,
            "past the last case nothing runs"
        );
        assert!(valid(IF, 2) && !valid(IF, 3) && !valid(WHILE, 2) && !valid(SWITCH, 0));
        assert!(!valid(3, 1), "an unknown type");
        assert!(!valid(SWITCH, MAX_CONDITIONAL_BODIES + 1));
    }

    #[test]
    fn nodes_round_trip_as_ordinary_requests() {
        let mut list = Vec::new();
        let launch = msg::LaunchKernel {
            ctx: 1,
            function: 7,
            grid_x: 2,
            ..Default::default()
        };
        push_op(&mut list, &launch, b"params");
        push_node(
            &mut list,
            MEM_FREE_NODE,
            &msg::GraphMemFreeNode { ptr: 0x1000 },
            &[],
        );
        let nodes = split_nodes(&list).unwrap();
        assert_eq!(nodes.len(), 2);
        let (r, tail) = Request::decode(nodes[0].opcode, nodes[0].payload).unwrap();
        assert_eq!(r, Request::LaunchKernel(launch));
        assert_eq!(&nodes[0].payload[tail..], b"params");
        assert_eq!(nodes[1].opcode, MEM_FREE_NODE);
    }

    #[test]
    fn truncated_lists_are_refused() {
        let mut list = Vec::new();
        push_op(&mut list, &msg::EventRecord::default(), &[]);
        for cut in [1, NODE_HEADER_LEN, list.len() - 1] {
            assert_eq!(
                split_nodes(&list[..cut]).unwrap_err(),
                NodeListError::Truncated { index: 0 }
            );
        }
    }

    #[test]
    fn dependency_lists_name_earlier_nodes() {
        let mut list = Vec::new();
        let rec = msg::EventRecord::default();
        push_op(&mut list, &rec, &[]);
        push_deps(&mut list, &[]);
        push_op(&mut list, &rec, &[]);
        push_op(&mut list, &rec, &[]);
        push_deps(&mut list, &[2, 0, 0]);
        push_op(&mut list, &rec, &[]);
        let deps: Vec<Vec<u32>> = split_graph(&list)
            .unwrap()
            .into_iter()
            .map(|n| n.deps)
            .collect();
        assert_eq!(deps, vec![vec![], vec![], vec![1], vec![0, 2]]);

        let mut fwd = Vec::new();
        push_op(&mut fwd, &rec, &[]);
        push_deps(&mut fwd, &[1]);
        push_op(&mut fwd, &rec, &[]);
        assert_eq!(
            split_graph(&fwd).unwrap_err(),
            NodeListError::ForwardDep { index: 1, dep: 1 }
        );
        let mut dangling = Vec::new();
        push_op(&mut dangling, &rec, &[]);
        push_deps(&mut dangling, &[0]);
        assert_eq!(
            split_graph(&dangling).unwrap_err(),
            NodeListError::BadDeps { index: 1 }
        );
        let mut twice = Vec::new();
        push_deps(&mut twice, &[]);
        push_deps(&mut twice, &[]);
        push_op(&mut twice, &rec, &[]);
        assert!(matches!(
            split_graph(&twice).unwrap_err(),
            NodeListError::BadDeps { .. }
        ));
        let mut ragged = Vec::new();
        push_node(&mut ragged, DEPS_NODE, &msg::Empty {}, &[1, 2, 3]);
        push_op(&mut ragged, &rec, &[]);
        assert!(matches!(
            split_graph(&ragged).unwrap_err(),
            NodeListError::BadDeps { .. }
        ));
    }

    #[test]
    fn lists_are_bounded() {
        let list = [0u8; NODE_HEADER_LEN].repeat(MAX_GRAPH_NODES + 1);
        assert_eq!(split_nodes(&list).unwrap_err(), NodeListError::TooManyNodes);
    }
}
