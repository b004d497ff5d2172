//! One listener's connections, shared among the addresses they come from. The webhook's port is
//! reachable from every pod unless a NetworkPolicy narrows it, and its one real client, the
//! apiserver, must find a connection whatever pods do: so when every place is taken, a newcomer
//! takes the place of an idle connection (one waiting for its next request, its handshake or its
//! request head) of the address that holds the most, the one idle the longest among them,
//! provided that address holds more than the newcomer's would with it. Idle connections are what
//! a flood holds cheaply; a connection whose request is being answered is never chosen, so
//! nothing already asked is lost; and one client's own burst (the apiserver's, beyond the
//! capacity) closes none of its own connections. Otherwise the newcomer waits (at most half as
//! many as the capacity, each at most the request timeout, none read from) for the next place freed
//! or made the same way when an answer leaves a connection idle; places go to the waiting
//! connection whose address holds the fewest. Beyond that, and beyond an address's own bound
//! where one is set (the health port's), a connection is closed at once.
//!
//! The choice is made under one lock, from counts and a logical clock (not time), so the tests
//! of the rules below need no timing.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

/// How many connections a listener serves, waits for, and lets one address hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// Connections served at once (past their handshake or on their way to it).
    pub capacity: usize,
    /// Connections accepted and waiting for a place, none of them read from.
    pub waiting: usize,
    /// The most one address may hold (served and waiting); `None`: no bound of its own.
    pub per_address: Option<usize>,
}

impl ShareLimits {
    /// `capacity` connections, half as many waiting (at least one), no bound per address. Waiting
    /// connections hold a descriptor each (and the kernel's buffers, as the listen backlog's
    /// do): half keeps the process's descriptors under 1 024 with the health port's and the
    /// watches', the soft limit some runtimes give containers.
    pub fn shared(capacity: usize) -> ShareLimits {
        let capacity = capacity.max(1);
        ShareLimits { capacity, waiting: (capacity / 2).max(1), per_address: None }
    }
}

/// A listener's connections and who waits for one.
#[derive(Debug)]
pub struct FairShare {
    limits: ShareLimits,
    /// Ticks at every admission and at every answered request: the order in which connections
    /// last did something.
    clock: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    served: HashMap<u64, Served>,
    /// Served connections by address (waiting ones counted apart).
    held: HashMap<IpAddr, usize>,
    waiting: VecDeque<Waiter>,
    waiting_by_address: HashMap<IpAddr, usize>,
    /// Connections told to close that have not closed yet: no longer counted as served, but
    /// bounded, so that closing them is never a way around the capacity.
    leaving: usize,
}

#[derive(Debug)]
struct Served {
    address: IpAddr,
    activity: Arc<Activity>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    address: IpAddr,
    handed: oneshot::Sender<Place>,
}

/// What one served connection is doing, shared with its task: whether a request of it is being
/// answered, when it last did something, and whether it was told to close.
#[derive(Debug, Default)]
pub struct Activity {
    answering: AtomicBool,
    last: AtomicU64,
    told_to_close: AtomicBool,
    close: Notify,
}

impl Activity {
    /// Resolves once the connection is told to close (at once if it already was).
    pub async fn told_to_close(&self) {
        self.close.notified().await;
    }

    fn is_idle(&self) -> bool {
        !self.answering.load(Ordering::SeqCst) && !self.told_to_close.load(Ordering::SeqCst)
    }
}

/// What happens to a connection just accepted.
pub enum Admission {
    /// It is served.
    Served(Place),
    /// It is served once handed a place (`None` from the receiver: it was not, and is closed).
    Waits(oneshot::Receiver<Place>, WaitingTicket),
    /// It is closed at once: its address holds all it may, or too many wait already.
    Refused,
}

/// A served connection's place, freed when dropped (handed to a waiting connection if one
/// waits).
#[derive(Debug)]
pub struct Place {
    share: Arc<FairShare>,
    id: u64,
    activity: Arc<Activity>,
    /// False for a place taken back before anyone held it: its drop frees nothing.
    armed: bool,
}

/// A waiting connection's entry, removed when dropped (it gave up, or was handed its place).
pub struct WaitingTicket {
    share: Arc<FairShare>,
    id: u64,
}

/// A request being answered on a connection: while it lives, the connection is never chosen to
/// make room.
pub struct Answering(Arc<Place>);

impl FairShare {
    /// An empty share with these limits.
    pub fn new(limits: ShareLimits) -> Arc<FairShare> {
        Arc::new(FairShare { limits, clock: AtomicU64::new(0), state: Mutex::new(State::default()) })
    }

    fn locked(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Decides for a connection from `address`, accepted just now.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Admission {
        let mut state = self.locked();
        let holds = state.held.get(&address).copied().unwrap_or(0)
            + state.waiting_by_address.get(&address).copied().unwrap_or(0);
        if self.limits.per_address.is_some_and(|limit| holds >= limit) {
            return Admission::Refused;
        }
        if state.served.len() < self.limits.capacity {
            return Admission::Served(self.serve(&mut state, address));
        }
        let served_here = state.held.get(&address).copied().unwrap_or(0);
        if state.leaving < self.limits.waiting
            && let Some(idle) = state.idle_to_make_room_for(served_here)
        {
            state.tell_to_close(idle);
            return Admission::Served(self.serve(&mut state, address));
        }
        if state.waiting.len() < self.limits.waiting {
            let id = state.next_id;
            state.next_id += 1;
            let (handed, receiver) = oneshot::channel();
            state.waiting.push_back(Waiter { id, address, handed });
            *state.waiting_by_address.entry(address).or_default() += 1;
            return Admission::Waits(receiver, WaitingTicket { share: self.clone(), id });
        }
        Admission::Refused
    }

    fn serve(self: &Arc<Self>, state: &mut State, address: IpAddr) -> Place {
        let id = state.next_id;
        state.next_id += 1;
        let activity = Arc::new(Activity::default());
        activity.last.store(self.tick(), Ordering::SeqCst);
        state.served.insert(id, Served { address, activity: activity.clone() });
        *state.held.entry(address).or_default() += 1;
        Place { share: self.clone(), id, activity, armed: true }
    }

    /// How many connections `address` holds (served).
    pub fn held_by(&self, address: IpAddr) -> usize {
        self.locked().held.get(&address).copied().unwrap_or(0)
    }

    /// Connections served now, and waiting (for tests and diagnostics).
    pub fn counts(&self) -> (usize, usize) {
        let state = self.locked();
        (state.served.len(), state.waiting.len())
    }

    /// The place of a connection that closed (or was told to and now has): freed, and handed
    /// to a waiting connection if one waits.
    fn release(self: &Arc<Self>, id: u64) {
        let mut state = self.locked();
        match state.served.remove(&id) {
            Some(served) => state.forget_held(served.address),
            // Told to close before: its place was another's already.
            None => state.leaving = state.leaving.saturating_sub(1),
        }
        self.hand_to_waiters(&mut state);
    }

    /// A request of connection `id` was answered: if connections wait, an idle one (this one,
    /// or another of an address holding more) is told to close and its place handed on.
    fn became_idle(self: &Arc<Self>) {
        let mut state = self.locked();
        if state.served.len() < self.limits.capacity {
            return;
        }
        let Some(next) = state.fewest_holding_waiter() else { return };
        let served_there = state.held.get(&state.waiting[next].address).copied().unwrap_or(0);
        if state.leaving < self.limits.waiting
            && let Some(idle) = state.idle_to_make_room_for(served_there)
        {
            state.tell_to_close(idle);
        }
        self.hand_to_waiters(&mut state);
    }

    /// Free places go to the waiting connections whose addresses hold the fewest (the longest
    /// waiting among them).
    fn hand_to_waiters(self: &Arc<Self>, state: &mut State) {
        while state.served.len() < self.limits.capacity {
            let Some(next) = state.fewest_holding_waiter() else { break };
            let Some(waiter) = state.waiting.remove(next) else { break };
            state.forget_waiting(waiter.address);
            if waiter.handed.is_closed() {
                continue;
            }
            let place = self.serve(state, waiter.address);
            if let Err(mut place) = waiter.handed.send(place) {
                // It gave up this very moment: the place is taken back here, under this lock.
                place.armed = false;
                state.served.remove(&place.id);
                state.forget_held(waiter.address);
            }
        }
    }
}

impl State {
    fn forget_held(&mut self, address: IpAddr) {
        if let Some(count) = self.held.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.held.remove(&address);
            }
        }
    }

    fn forget_waiting(&mut self, address: IpAddr) {
        if let Some(count) = self.waiting_by_address.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.waiting_by_address.remove(&address);
            }
        }
    }

    /// The idle connection to close for a newcomer whose address holds `newcomers` served: of
    /// the address holding the most, the one idle the longest, if that address holds more than
    /// the newcomer's would with it.
    fn idle_to_make_room_for(&self, newcomers: usize) -> Option<u64> {
        let holds = |served: &Served| self.held.get(&served.address).copied().unwrap_or(0);
        self.served
            .iter()
            .filter(|(_, served)| served.activity.is_idle())
            .max_by_key(|(id, served)| {
                (holds(served), std::cmp::Reverse(served.activity.last.load(Ordering::SeqCst)), std::cmp::Reverse(**id))
            })
            .filter(|(_, served)| holds(served) > newcomers + 1)
            .map(|(id, _)| *id)
    }

    /// Tells connection `id` to close; its place is another's from now on.
    fn tell_to_close(&mut self, id: u64) {
        if let Some(served) = self.served.remove(&id) {
            self.forget_held(served.address);
            served.activity.told_to_close.store(true, Ordering::SeqCst);
            served.activity.close.notify_one();
            self.leaving += 1;
        }
    }

    fn fewest_holding_waiter(&self) -> Option<usize> {
        self.waiting
            .iter()
            .enumerate()
            .min_by_key(|(at, waiter)| (self.held.get(&waiter.address).copied().unwrap_or(0), *at))
            .map(|(at, _)| at)
    }
}

impl Place {
    /// What the connection does, for its task to watch for being told to close.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// A request's head arrived: until the returned guard drops, the connection is not chosen
    /// to make room.
    pub fn answering(self: &Arc<Self>) -> Answering {
        self.activity.answering.store(true, Ordering::SeqCst);
        Answering(self.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let place = &self.0;
        place.activity.last.store(place.share.tick(), Ordering::SeqCst);
        place.activity.answering.store(false, Ordering::SeqCst);
        place.share.became_idle();
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.armed {
            self.share.clone().release(self.id);
        }
    }
}

impl Drop for WaitingTicket {
    fn drop(&mut self) {
        let mut state = self.share.locked();
        if let Some(at) = state.waiting.iter().position(|waiter| waiter.id == self.id)
            && let Some(waiter) = state.waiting.remove(at)
        {
            state.forget_waiting(waiter.address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn served(admission: Admission) -> Arc<Place> {
        match admission {
            Admission::Served(place) => Arc::new(place),
            Admission::Waits(..) => panic!("waits, where it should be served"),
            Admission::Refused => panic!("refused, where it should be served"),
        }
    }

    fn waits(admission: Admission) -> (oneshot::Receiver<Place>, WaitingTicket) {
        match admission {
            Admission::Waits(receiver, ticket) => (receiver, ticket),
            Admission::Served(_) => panic!("served, where it should wait"),
            Admission::Refused => panic!("refused, where it should wait"),
        }
    }

    fn told(place: &Place) -> bool {
        place.activity.told_to_close.load(Ordering::SeqCst)
    }

    #[test]
    fn below_capacity_every_connection_is_served_and_a_closed_one_frees_its_place() {
        let share = FairShare::new(ShareLimits::shared(2));
        let first = served(share.admit(address(1)));
        let _second = served(share.admit(address(1)));
        assert_eq!(share.counts(), (2, 0));
        drop(first);
        assert_eq!(share.counts(), (1, 0));
    }

    #[test]
    fn a_full_share_closes_the_largest_holders_longest_idle_connection_for_a_newcomer() {
        let share = FairShare::new(ShareLimits::shared(4));
        let flood: Vec<_> = (0..3).map(|_| served(share.admit(address(9)))).collect();
        let other = served(share.admit(address(2)));
        // The newest of the flood answered a request since: the oldest idle one goes.
        drop(flood[2].answering());
        let apiserver = served(share.admit(address(1)));
        assert!(told(&flood[0]), "the flood's longest idle connection was kept");
        assert!(!told(&flood[1]) && !told(&flood[2]) && !told(&other) && !told(&apiserver));
        assert_eq!(share.counts(), (4, 0));
        // The one told to close frees nothing when it closes: its place is the newcomer's.
        let mut flood = flood;
        drop(flood.remove(0));
        assert_eq!(share.counts(), (4, 0));
    }

    #[test]
    fn one_address_s_burst_beyond_the_capacity_waits_and_closes_none_of_its_own() {
        let share = FairShare::new(ShareLimits::shared(2));
        let first = served(share.admit(address(1)));
        let second = served(share.admit(address(1)));
        let (mut handed, _ticket) = waits(share.admit(address(1)));
        // Idle, but the newcomer's own address's: kept.
        assert!(!told(&first) && !told(&second));
        drop(first.answering());
        assert!(!told(&first) && handed.try_recv().is_err(), "an answer closed the client's own connection");
        // Its own connection closing hands it the place.
        drop(first);
        let _place = handed.try_recv().expect("the waiting connection was not handed the freed place");
        drop((second, _place));
        // Nor does an address holding no more than the newcomer's would with it make room.
        let share = FairShare::new(ShareLimits::shared(2));
        let one = served(share.admit(address(1)));
        let two = served(share.admit(address(2)));
        assert!(matches!(share.admit(address(3)), Admission::Waits(..)));
        assert!(!told(&one) && !told(&two));
    }

    #[test]
    fn a_connection_whose_request_is_being_answered_is_never_chosen() {
        let share = FairShare::new(ShareLimits::shared(2));
        let first = served(share.admit(address(9)));
        let second = served(share.admit(address(9)));
        let first_answering = first.answering();
        let second_answering = second.answering();
        let (mut handed, _ticket) = waits(share.admit(address(1)));
        assert!(!told(&first) && !told(&second));
        assert!(handed.try_recv().is_err(), "handed a place while every connection was answering");
        // An answer sent: that connection, now idle, makes room for the waiting one.
        drop(first_answering);
        assert!(told(&first));
        let place = handed.try_recv().expect("the waiting connection was not handed the freed place");
        assert_eq!(share.held_by(address(1)), 1);
        drop(second_answering);
        assert!(!told(&second), "no one waits: an idle connection is left alone");
        drop(place);
    }

    #[test]
    fn a_freed_place_goes_to_the_waiter_whose_address_holds_the_fewest() {
        let share = FairShare::new(ShareLimits { capacity: 2, waiting: 2, per_address: None });
        let busy: Vec<_> = (0..2).map(|_| served(share.admit(address(9)))).collect();
        let mut answering: Vec<_> = busy.iter().map(|place| place.answering()).collect();
        let (mut flood_waits, _flood_ticket) = waits(share.admit(address(9)));
        let (mut other_waits, _other_ticket) = waits(share.admit(address(2)));
        // One answer sent: that connection makes room, and the address holding none, though it
        // came second, is handed the place.
        drop(answering.remove(0));
        assert!(told(&busy[0]));
        let _other = other_waits.try_recv().expect("the address holding none waited on");
        assert!(flood_waits.try_recv().is_err(), "the flood's third connection was served first");
        assert_eq!((share.held_by(address(9)), share.held_by(address(2))), (1, 1));
    }

    #[test]
    fn beyond_the_waiting_bound_or_an_address_s_own_bound_a_connection_is_refused() {
        let share = FairShare::new(ShareLimits { capacity: 1, waiting: 1, per_address: None });
        let only = served(share.admit(address(9)));
        let _answering = only.answering();
        let (_handed, _ticket) = waits(share.admit(address(9)));
        assert!(matches!(share.admit(address(1)), Admission::Refused));

        let health = FairShare::new(ShareLimits { capacity: 8, waiting: 2, per_address: Some(2) });
        let _held: Vec<_> = (0..2).map(|_| served(health.admit(address(9)))).collect();
        assert!(matches!(health.admit(address(9)), Admission::Refused), "a third from one address was let in");
        let _other = served(health.admit(address(1)));
    }

    #[test]
    fn the_shared_limits_let_half_the_capacity_wait() {
        assert_eq!(ShareLimits::shared(10), ShareLimits { capacity: 10, waiting: 5, per_address: None });
        assert_eq!(ShareLimits::shared(3), ShareLimits { capacity: 3, waiting: 1, per_address: None });
        assert_eq!(ShareLimits::shared(0), ShareLimits { capacity: 1, waiting: 1, per_address: None });
    }

    #[test]
    fn the_longest_idle_is_told_by_when_it_last_answered_not_by_when_it_came() {
        let share = FairShare::new(ShareLimits::shared(3));
        let flood: Vec<_> = (0..3).map(|_| served(share.admit(address(9)))).collect();
        // The oldest connection answered since: the second is now the longest idle.
        drop(flood[0].answering());
        let _newcomer = served(share.admit(address(1)));
        assert!(told(&flood[1]), "the connection idle the longest was kept");
        assert!(!told(&flood[0]) && !told(&flood[2]), "a connection that answered since was told to close");
    }

    #[test]
    fn an_address_s_own_bound_counts_its_waiting_connections_too() {
        let share = FairShare::new(ShareLimits { capacity: 1, waiting: 4, per_address: Some(2) });
        let only = served(share.admit(address(9)));
        let _answering = only.answering();
        let (_handed, _ticket) = waits(share.admit(address(9)));
        // One served and one waiting: the address holds its two.
        assert!(matches!(share.admit(address(9)), Admission::Refused), "a third from one address waited");
        let (_other, _other_ticket) = waits(share.admit(address(1)));
    }

    #[test]
    fn an_address_s_waiting_count_follows_its_waiters_giving_up() {
        let share = FairShare::new(ShareLimits { capacity: 1, waiting: 8, per_address: Some(3) });
        let only = served(share.admit(address(9)));
        let _answering = only.answering();
        let gave_up = waits(share.admit(address(9)));
        let _stays = waits(share.admit(address(9)));
        drop(gave_up);
        // One served and one waiting: a third may wait, a fourth may not.
        let _third = waits(share.admit(address(9)));
        assert!(matches!(share.admit(address(9)), Admission::Refused), "a fourth from one address waited");
    }

    #[test]
    fn a_waiter_giving_up_removes_its_own_entry_not_another_s() {
        let share = FairShare::new(ShareLimits { capacity: 1, waiting: 2, per_address: None });
        let only = served(share.admit(address(9)));
        let answering = only.answering();
        let (mut stays, _stays_ticket) = waits(share.admit(address(1)));
        let gives_up = waits(share.admit(address(2)));
        drop(gives_up);
        assert_eq!(share.counts(), (1, 1));
        drop((answering, only));
        let _place = stays.try_recv().expect("the waiter that stayed lost its entry to one that gave up");
    }

    #[test]
    fn connections_told_to_close_but_not_yet_closed_are_bounded_by_the_waiting_bound() {
        let share = FairShare::new(ShareLimits { capacity: 3, waiting: 1, per_address: None });
        let flood: Vec<_> = (0..3).map(|_| served(share.admit(address(9)))).collect();
        let _first = served(share.admit(address(1)));
        assert!(told(&flood[0]));
        // The told one has not closed: one leaving is all the waiting bound allows, so the next
        // newcomer waits rather than another of the flood's being told.
        let (mut handed, _ticket) = waits(share.admit(address(2)));
        assert!(!told(&flood[1]) && !told(&flood[2]), "more were told to close than the bound allows");
        // Nor does an answer, while the told one is still leaving.
        drop(flood[2].answering());
        assert!(!told(&flood[1]) && !told(&flood[2]), "an answer told another to close beyond the bound");
        assert!(handed.try_recv().is_err(), "handed a place while every place was taken");
        let mut flood = flood;
        drop(flood.remove(0));
        // Closed now: the flood's longest idle connection makes room at the next answer.
        drop(flood[0].answering());
        assert!(told(&flood[1]) && !told(&flood[0]), "the flood's longest idle connection was kept");
        let _second = handed.try_recv().expect("the waiting connection was not handed a place once the first closed");
    }

    #[test]
    fn a_waiter_that_gave_up_is_skipped_and_its_entry_forgotten() {
        let share = FairShare::new(ShareLimits::shared(1));
        let only = served(share.admit(address(9)));
        let answering = only.answering();
        let (gave_up, ticket) = waits(share.admit(address(2)));
        drop((gave_up, ticket));
        assert_eq!(share.counts(), (1, 0));
        let (mut handed, _ticket) = waits(share.admit(address(3)));
        // An address holding one is not made to give it up for another that would hold one.
        drop(answering);
        assert!(!told(&only) && handed.try_recv().is_err());
        drop(only);
        let _place = handed.try_recv().expect("the waiting connection was not handed the freed place");
        assert_eq!((share.held_by(address(2)), share.held_by(address(3))), (0, 1));
    }
}
