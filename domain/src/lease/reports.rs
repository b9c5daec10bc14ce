//! What the lease book remembers of reports: counts per outcome on each
//! lease, and the latest few details across all leases. Keeping every
//! report's detail per lease let one client grow memory without bound.

use std::collections::VecDeque;

use super::Outcome;

/// Reports on one lease, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportCounts {
    pub ok: u32,
    pub blocked: u32,
    pub error: u32,
}

impl ReportCounts {
    pub fn add(&mut self, outcome: Outcome) {
        let n = match outcome {
            Outcome::Ok => &mut self.ok,
            Outcome::Blocked => &mut self.blocked,
            Outcome::Error => &mut self.error,
        };
        *n = n.saturating_add(1);
    }
}

/// One recent report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecentReport {
    pub lease: String,
    pub outcome: Outcome,
    pub detail: Option<String>,
}

/// The latest reports, oldest dropped first.
#[derive(Clone, Debug)]
pub(super) struct RecentReports {
    capacity: usize,
    entries: VecDeque<RecentReport>,
    detail_bytes: usize,
}

impl RecentReports {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: VecDeque::new(),
            detail_bytes: 0,
        }
    }

    pub(super) fn push(&mut self, report: RecentReport) {
        if self.capacity == 0 {
            return;
        }
        while self.entries.len() >= self.capacity {
            if let Some(old) = self.entries.pop_front() {
                self.detail_bytes -= old.detail.as_ref().map_or(0, String::len);
            }
        }
        self.detail_bytes += report.detail.as_ref().map_or(0, String::len);
        self.entries.push_back(report);
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn detail_bytes(&self) -> usize {
        self.detail_bytes
    }

    /// Newest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &RecentReport> {
        self.entries.iter().rev()
    }
}
