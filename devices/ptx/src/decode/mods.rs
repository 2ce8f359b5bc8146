//! Instruction modifiers (every one understood or explicitly ignored), unsupported
//! instructions and special register names.

use super::*;

/// Per-instruction modifier bookkeeping: every modifier must be understood or explicitly ignored.
pub(super) struct Mods<'a> {
    list: &'a [String],
    used: Vec<bool>,
}

/// Modifiers that do not change results in this interpreter (cache policy, memory-model scope,
/// alignment and convergence assertions).
pub(super) fn ignorable(m: &str) -> bool {
    matches!(
        m,
        "ca" | "cg"
            | "cs"
            | "lu"
            | "cv"
            | "wb"
            | "wt"
            | "weak"
            | "relaxed"
            | "cta"
            | "gpu"
            | "sys"
            | "aligned"
            | "uni"
            | "approx"
            | "full"
            | "noftz"
            | "unified"
            | "sc"
            | "mmio"
    ) || m.starts_with("L1::")
        || m.starts_with("L2::")
        || m.starts_with("level::")
}

/// Comparison modifiers and the comparisons they name; the first six are those every
/// comparing instruction takes (video instructions take only them).
const COMPARISONS: [(&str, Cmp); 18] = [
    ("eq", Cmp::Eq),
    ("ne", Cmp::Ne),
    ("lt", Cmp::Lt),
    ("le", Cmp::Le),
    ("gt", Cmp::Gt),
    ("ge", Cmp::Ge),
    ("lo", Cmp::Lo),
    ("ls", Cmp::Ls),
    ("hi", Cmp::Hi),
    ("hs", Cmp::Hs),
    ("equ", Cmp::Equ),
    ("neu", Cmp::Neu),
    ("ltu", Cmp::Ltu),
    ("leu", Cmp::Leu),
    ("gtu", Cmp::Gtu),
    ("geu", Cmp::Geu),
    ("num", Cmp::Num),
    ("nan", Cmp::Nan),
];
/// How many of [`COMPARISONS`] every comparing instruction takes.
const BASIC_COMPARISONS: usize = 6;

impl<'a> Mods<'a> {
    /// The first comparison modifier (of the six basic ones only, with `basic`), marked as
    /// understood.
    pub(super) fn comparison(&mut self, basic: bool) -> Option<Cmp> {
        let known = if basic {
            &COMPARISONS[..BASIC_COMPARISONS]
        } else {
            &COMPARISONS[..]
        };
        for (i, m) in self.list.iter().enumerate() {
            if let Some(&(_, c)) = known.iter().find(|(name, _)| name == m) {
                self.used[i] = true;
                return Some(c);
            }
        }
        None
    }

    pub(super) fn new(list: &'a [String]) -> Self {
        Mods {
            list,
            used: vec![false; list.len()],
        }
    }

    pub(super) fn has(&mut self, s: &str) -> bool {
        let mut found = false;
        for (i, m) in self.list.iter().enumerate() {
            if m == s {
                self.used[i] = true;
                found = true;
            }
        }
        found
    }

    pub(super) fn any(&mut self, opts: &[&'static str]) -> Option<&'static str> {
        for (i, m) in self.list.iter().enumerate() {
            if let Some(o) = opts.iter().find(|o| **o == m) {
                self.used[i] = true;
                return Some(o);
            }
        }
        None
    }

    /// Every modifier `f` recognizes, in order, each marked as understood.
    pub(super) fn take_all<T>(&mut self, f: impl Fn(&str) -> Option<T>) -> Vec<T> {
        let mut out = Vec::new();
        for (i, m) in self.list.iter().enumerate() {
            if let Some(t) = f(m) {
                self.used[i] = true;
                out.push(t);
            }
        }
        out
    }

    pub(super) fn types(&mut self) -> Vec<Ty> {
        let mut out = Vec::new();
        for (i, m) in self.list.iter().enumerate() {
            if let Some(t) = Ty::parse(m) {
                self.used[i] = true;
                out.push(t);
            }
        }
        out
    }

    pub(super) fn rnd(&mut self) -> Rnd {
        match self.any(&["rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi"]) {
            Some("rn") => Rnd::Rn,
            Some("rz") => Rnd::Rz,
            Some("rm") => Rnd::Rm,
            Some("rp") => Rnd::Rp,
            Some("rna") => Rnd::Rna,
            Some("rni") => Rnd::Rni,
            Some("rzi") => Rnd::Rzi,
            Some("rmi") => Rnd::Rmi,
            Some("rpi") => Rnd::Rpi,
            _ => Rnd::Default,
        }
    }

    pub(super) fn space(&mut self) -> Space {
        match self.any(&[
            "global",
            "shared",
            "shared::cta",
            "local",
            "const",
            "param",
            "param::entry",
            "param::func",
        ]) {
            Some("global") => Space::Global,
            Some("shared") | Some("shared::cta") => Space::Shared,
            Some("local") => Space::Local,
            Some("const") => Space::Const,
            Some("param") | Some("param::entry") | Some("param::func") => Space::Param,
            _ => Space::Generic,
        }
    }

    pub(super) fn ord(&mut self) -> MemOrd {
        let acq = self.has("acquire");
        let rel = self.has("release");
        let vol = self.has("volatile");
        let _ = vol;
        let acq_rel = self.has("acq_rel");
        if acq || acq_rel {
            MemOrd::Acquire
        } else if rel {
            MemOrd::Release
        } else {
            MemOrd::Relaxed
        }
    }

    pub(super) fn finish(&self, ins: &Instr) -> Result<(), LoadError> {
        for (i, m) in self.list.iter().enumerate() {
            if !self.used[i] && !ignorable(m) {
                return Err(unsupported(ins));
            }
        }
        Ok(())
    }
}

pub(super) fn unsupported(ins: &Instr) -> LoadError {
    LoadError::unsupported(
        ins.line,
        format!("unsupported instruction `{}`", ins.full_name()),
    )
}

/// `%envreg0` to `%envreg31`.
const ENVREGS: u8 = 32;

pub(super) fn special_reg(name: &str) -> Option<Sreg> {
    let comp = |c: &str| match c {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, c)) = name.split_once('.') {
        let c = comp(c)?;
        return Some(match base {
            "%tid" => Sreg::Tid(c),
            "%ntid" => Sreg::Ntid(c),
            "%ctaid" => Sreg::Ctaid(c),
            "%nctaid" => Sreg::Nctaid(c),
            "%cluster_ctaid" => Sreg::ClusterCtaId(c),
            "%cluster_nctaid" => Sreg::ClusterNCtaId(c),
            "%clusterid" => Sreg::ClusterId(c),
            "%nclusterid" => Sreg::NClusterId(c),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => Sreg::LaneId,
        "%warpid" => Sreg::WarpId,
        "%nwarpid" => Sreg::NWarpId,
        "%smid" => Sreg::SmId,
        "%nsmid" => Sreg::NSmId,
        "%gridid" => Sreg::GridId,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%globaltimer" => Sreg::GlobalTimer,
        "%globaltimer_lo" => Sreg::GlobalTimerLo,
        "%globaltimer_hi" => Sreg::GlobalTimerHi,
        "%lanemask_eq" => Sreg::LanemaskEq,
        "%lanemask_le" => Sreg::LanemaskLe,
        "%lanemask_lt" => Sreg::LanemaskLt,
        "%lanemask_ge" => Sreg::LanemaskGe,
        "%lanemask_gt" => Sreg::LanemaskGt,
        "%dynamic_smem_size" => Sreg::DynamicSmemSize,
        "%total_smem_size" => Sreg::TotalSmemSize,
        "%cluster_ctarank" => Sreg::ClusterCtaRank,
        "%cluster_nctarank" => Sreg::ClusterNCtaRank,
        "%is_explicit_cluster" => Sreg::IsExplicitCluster,
        "%tid" => Sreg::Tid(0),
        "%ntid" => Sreg::Ntid(0),
        "%ctaid" => Sreg::Ctaid(0),
        "%nctaid" => Sreg::Nctaid(0),
        _ => {
            let n: u8 = name.strip_prefix("%envreg")?.parse().ok()?;
            if n >= ENVREGS {
                return None;
            }
            Sreg::EnvReg(n)
        }
    })
}
