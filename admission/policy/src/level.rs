//! Pod Security levels and the three modes they are applied in.

use std::fmt;

/// A Pod Security level. The derived order runs from least to most permissive, so
/// `driver > namespace` reads "the driver needs more than the namespace allows".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The most restrictive level.
    Restricted,
    /// The middle level.
    Baseline,
    /// The unrestricted level.
    Privileged,
}

/// What a valid level looks like, as every message about a bad level says it.
pub const MUST_BE_A_LEVEL: &str = "must be one of privileged, baseline, restricted";

impl Level {
    /// Every level, most permissive first.
    pub const ALL: [Level; 3] = [Level::Privileged, Level::Baseline, Level::Restricted];

    /// Parses a label or config value; `None` for anything but the three exact spellings.
    pub fn parse(value: &str) -> Option<Level> {
        match value {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    /// The level's place in the order as a number, 0 (`restricted`) to 2 (`privileged`): how
    /// the generated CEL policies compare levels.
    pub fn rank(self) -> u8 {
        match self {
            Level::Restricted => 0,
            Level::Baseline => 1,
            Level::Privileged => 2,
        }
    }

    /// The label spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a violation at a level is acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Deny the request.
    Enforce,
    /// Return an admission warning.
    Warn,
    /// Record an audit annotation.
    Audit,
}

impl Mode {
    /// Every mode, in the order verdicts are built.
    pub const ALL: [Mode; 3] = [Mode::Enforce, Mode::Warn, Mode::Audit];

    /// The word used in messages and label keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_runs_from_restricted_to_privileged() {
        assert!(Level::Restricted < Level::Baseline);
        assert!(Level::Baseline < Level::Privileged);
    }

    #[test]
    fn ranks_follow_the_order() {
        assert_eq!(Level::ALL.map(Level::rank), [2, 1, 0]);
        for a in Level::ALL {
            for b in Level::ALL {
                assert_eq!(a.rank() < b.rank(), a < b, "{a} against {b}");
            }
        }
    }

    #[test]
    fn parse_accepts_only_exact_spellings() {
        for level in Level::ALL {
            assert_eq!(Level::parse(level.as_str()), Some(level));
        }
        for bad in ["", "Privileged", " baseline", "restricted ", "root"] {
            assert_eq!(Level::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn levels_and_modes_print_as_their_label_words() {
        let printed: Vec<String> = Level::ALL.iter().map(|l| l.to_string()).collect();
        assert_eq!(printed, ["privileged", "baseline", "restricted"]);
        let printed: Vec<String> = Mode::ALL.iter().map(|m| format!("{m}")).collect();
        assert_eq!(printed, ["enforce", "warn", "audit"]);
    }
}
