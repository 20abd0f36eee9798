//! Records of trace format 1 made current. Their switch-ins do not say what kind of wait they
//! ended (format 2's kernel side does: tracer-ebpf `sched/`); format 1's records came in
//! time order, so following each thread's transitions tells it, by the kernel side's rules.
//! Done as the file is read, so nothing after the reader knows format 1.

use std::collections::HashMap;

use tracer_common::{EventKind, WAIT_CODE_SHIFT, WaitCode};

use crate::recording::records::Record;

#[derive(Debug, Default, Clone, Copy)]
struct ThreadState {
    runnable: bool,
    moved: bool,
}

/// Follows every thread's transitions far enough to classify the wait each switch-in ends.
#[derive(Debug, Default)]
pub struct Upgrade {
    threads: HashMap<u32, ThreadState>,
}

impl Upgrade {
    /// The record as format 2 has it: a switch-in gets the code of the wait it ended
    /// (whether or not the wait's start was seen); other records are unchanged.
    pub fn record(&mut self, r: Record) -> Record {
        let Record::Event(mut ev) = r else {
            return r;
        };
        let Ok(kind) = ev.event_kind() else {
            return r;
        };
        let st = self.threads.entry(ev.tid).or_default();
        match kind {
            EventKind::SwitchOut => {
                st.runnable = ev.aux & 1 == 1;
                st.moved = false;
            }
            EventKind::Wakeup | EventKind::WakeupNew => st.runnable = true,
            // A wakeup places the task (and fires the migration) before the wakeup event, so a
            // migration seen while blocked is a wakeup placement, not a forced move.
            EventKind::Migrate => st.moved |= st.runnable,
            EventKind::SwitchIn => {
                let code = if st.moved {
                    WaitCode::Migration
                } else if ev.aux == 0 {
                    WaitCode::IdleCpu
                } else {
                    WaitCode::Contention
                };
                *st = ThreadState::default();
                ev.kind = (ev.kind & tracer_common::KIND_MASK) | (code as u32) << WAIT_CODE_SHIFT;
            }
            EventKind::ThreadExit => {
                self.threads.remove(&ev.tid);
            }
            _ => {}
        }
        Record::Event(ev)
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Event;

    use super::*;
    use crate::recording::{collect::Collector, waits::WaitKind};

    fn ev(tid: u32, kind: EventKind, aux: u32) -> Record {
        Record::Event(Event {
            ts_ns: 0,
            tid,
            kind: kind as u32,
            cpu: 0,
            aux,
            value: 1,
        })
    }

    /// The wait kind an upgraded switch-in carries, and the task that had the CPU before.
    fn ended(u: &mut Upgrade, r: Record) -> Option<(WaitKind, u32)> {
        match u.record(r) {
            Record::Event(e) if e.event_kind() == Ok(EventKind::SwitchIn) => {
                Some((WaitKind::of(&e)?, e.aux))
            }
            _ => None,
        }
    }

    #[test]
    fn classifies_by_what_happened_while_waiting() {
        use EventKind::*;
        let mut t = Upgrade::default();
        // Preempted, then run again after another task: contention.
        assert_eq!(ended(&mut t, ev(1, SwitchOut, 1)), None);
        let w = ended(&mut t, ev(1, SwitchIn, 42)).unwrap();
        assert_eq!(w, (WaitKind::Contention, 42));
        // Preempted, moved, run: migration (even if the new CPU was idle).
        ended(&mut t, ev(1, SwitchOut, 1));
        ended(&mut t, ev(1, Migrate, 0));
        assert_eq!(
            ended(&mut t, ev(1, SwitchIn, 0)).unwrap().0,
            WaitKind::Migration
        );
        // Blocked, placed on another CPU by its wakeup, run after the idle task: not a
        // forced move; the CPU was idle.
        ended(&mut t, ev(1, SwitchOut, 0));
        ended(&mut t, ev(1, Migrate, 0));
        ended(&mut t, ev(1, Wakeup, 0));
        assert_eq!(
            ended(&mut t, ev(1, SwitchIn, 0)).unwrap().0,
            WaitKind::IdleCpu
        );
    }

    #[test]
    fn records_of_format_1_are_classified_from_their_transitions() {
        // No wait codes, in time order: preempted, moved, run after another task.
        let at = |ts, tid, kind, aux, value| {
            Record::Event(Event {
                ts_ns: ts,
                tid,
                kind: kind as u32,
                cpu: 0,
                aux,
                value,
            })
        };
        let records = [
            at(100, 1, EventKind::SwitchOut, 1, 50),
            at(150, 1, EventKind::Migrate, 0, 0),
            at(300, 1, EventKind::SwitchIn, 7, 200),
            at(400, 1, EventKind::SwitchOut, 1, 100),
            at(450, 1, EventKind::SwitchIn, 9, 50),
        ];
        let mut upgrade = Upgrade::default();
        let mut upgraded = Collector::new(0, 1_000, false);
        for r in records {
            upgraded.on_record(upgrade.record(r));
        }
        let w = upgraded.take_waits()[&1];
        assert_eq!((w.migration_waits, w.contention_waits), (1, 1));
        // Without the upgrade the same records carry no classification.
        let mut current = Collector::new(0, 1_000, false);
        for r in records {
            current.on_record(r);
        }
        let w = current.take_waits()[&1];
        assert_eq!((w.migration_waits, w.contention_waits), (0, 0));
    }
}
