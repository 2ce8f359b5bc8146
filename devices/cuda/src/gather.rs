//! Pieces laid back to back: the scatter-gather lists of a copy (the guest pages it lies in) seen
//! as one byte stream, so that staged copies fill and drain whole staging chunks however the
//! pieces are cut. Pure and safe; the staging code owns the pinned memory. Bytes move in the
//! simulated GPU's pieces (`vgpu_ptx::mem::copy_in_pieces`), faster than one long `memcpy` on
//! some hosts.

use vgpu_ptx::mem::copy_in_pieces;

/// A position in a list of pieces laid back to back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    piece: usize,
    offset: usize,
}

/// Fills `dst` with the next bytes of `pieces` from `cur` and moves `cur` past them. Returns
/// how many bytes it copied: `dst.len()` unless the pieces ran out first.
pub(crate) fn gather(pieces: &[&[u8]], cur: &mut Cursor, dst: &mut [u8]) -> usize {
    let mut done = 0;
    while done < dst.len() {
        let Some(p) = pieces.get(cur.piece) else {
            break;
        };
        let n = (p.len() - cur.offset).min(dst.len() - done);
        copy_in_pieces(&mut dst[done..done + n], &p[cur.offset..cur.offset + n]);
        done += n;
        advance(cur, n, p.len());
    }
    done
}

/// Copies `src` into the next bytes of `pieces` from `cur` and moves `cur` past them. Returns
/// how many bytes it copied: `src.len()` unless the pieces ran out first.
pub(crate) fn scatter(pieces: &mut [&mut [u8]], cur: &mut Cursor, src: &[u8]) -> usize {
    let mut done = 0;
    while done < src.len() {
        let Some(p) = pieces.get_mut(cur.piece) else {
            break;
        };
        let n = (p.len() - cur.offset).min(src.len() - done);
        copy_in_pieces(&mut p[cur.offset..cur.offset + n], &src[done..done + n]);
        done += n;
        let len = p.len();
        advance(cur, n, len);
    }
    done
}

/// Moves `cur` `n` bytes on inside a piece of `len` bytes, to the next piece at its end (empty
/// pieces are stepped over the same way: `n` = 0 = `len`).
fn advance(cur: &mut Cursor, n: usize, len: usize) {
    cur.offset += n;
    if cur.offset == len {
        cur.piece += 1;
        cur.offset = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathering_walks_pieces_of_any_size_in_order() {
        let data: Vec<u8> = (0..=255).collect();
        let pieces: Vec<&[u8]> = vec![
            &data[..3],
            &[],
            &data[3..100],
            &data[100..101],
            &data[101..],
        ];
        let mut cur = Cursor::default();
        let mut out = Vec::new();
        // Chunks that cut pieces anywhere, as staging halves do.
        for n in [2, 50, 1, 0, 120, 200] {
            let mut chunk = vec![0u8; n];
            let got = gather(&pieces, &mut cur, &mut chunk);
            out.extend_from_slice(&chunk[..got]);
        }
        assert_eq!(out, data);
        // Exhausted: nothing more comes.
        assert_eq!(gather(&pieces, &mut cur, &mut [0u8; 4]), 0);
    }

    #[test]
    fn scattering_fills_pieces_in_order_and_stops_at_their_end() {
        let data: Vec<u8> = (0..100).collect();
        let (mut a, mut b, mut c) = ([0u8; 7], [0u8; 0], [0u8; 90]);
        let mut pieces: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
        let mut cur = Cursor::default();
        assert_eq!(scatter(&mut pieces, &mut cur, &data[..5]), 5);
        assert_eq!(scatter(&mut pieces, &mut cur, &data[5..60]), 55);
        // Only 37 bytes of room are left.
        assert_eq!(scatter(&mut pieces, &mut cur, &data[60..]), 37);
        drop(pieces);
        assert_eq!(&a[..], &data[..7]);
        assert_eq!(&c[..], &data[7..97]);
    }
}
