//! The nodes of an executable graph as [`crate::msg::GraphInstantiate`] carries them in its bulk
//! tail: one after another, in a topological order of the graph, each
//!
//! ```text
//! offset size field
//!      0    2 opcode   a request opcode (LaunchKernel, MemcpyDtoD, Memset, EventRecord,
//!                      StreamWaitEvent) or MEM_ALLOC_NODE / MEM_FREE_NODE
//!      2    4 len      bytes of the node's payload that follow
//!      6  len payload  the request's fields (and bulk tail: a launch's packed parameters),
//!                      exactly as that request would carry them on its own
//! ```
//!
//! The host replays the nodes in this order on the launch stream, each through the same path as
//! the ordinary request (its `ctx` and `stream` fields are replaced by the launch's).

use thiserror::Error;

use crate::msg::{Message, Op};

/// Opcode of a [`crate::msg::GraphMemAllocNode`] inside a graph (not a request of its own).
pub const MEM_ALLOC_NODE: u16 = 0x09f0;
/// Opcode of a [`crate::msg::GraphMemFreeNode`] inside a graph (not a request of its own).
pub const MEM_FREE_NODE: u16 = 0x09f1;
/// Most nodes one executable graph may hold.
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

/// Splits a node list; refuses truncated nodes and lists longer than [`MAX_GRAPH_NODES`].
pub fn split_nodes(mut bytes: &[u8]) -> Result<Vec<NodeBytes<'_>>, NodeListError> {
    let mut nodes = Vec::new();
    while !bytes.is_empty() {
        let index = nodes.len();
        if index == MAX_GRAPH_NODES {
            return Err(NodeListError::TooManyNodes);
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
    fn lists_are_bounded() {
        let list = [0u8; NODE_HEADER_LEN].repeat(MAX_GRAPH_NODES + 1);
        assert_eq!(split_nodes(&list).unwrap_err(), NodeListError::TooManyNodes);
    }
}
