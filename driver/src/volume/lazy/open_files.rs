//! The open files of a lazy volume, and which content the kernel's page cache of each file may
//! hold. A read through the page cache costs no trip to the driver, so a file opened again with
//! the content it was last opened with is served from it; but the kernel keeps one page cache
//! and one size per file, while each open of a lazy file reads the content had at that open. The
//! rule kept here makes both true at once:
//!
//! - a file has at most one *paged* content; every handle reading through the page cache (a
//!   paged handle) reads exactly that content, and the size the kernel is told is its size;
//! - an open whose content differs from the paged one, while paged handles of it are still open,
//!   is served by direct I/O (its own content, to its end, past any size the kernel holds);
//! - with no paged handle open, the paged content is changed by a *switch*: it is first cleared
//!   (no open becomes paged meanwhile), the caller drops the kernel's pages and attributes of the
//!   file, and only then is the new content made paged.
//!
//! The paged content is known by its id (see [`Fetched`]) and size only; its bytes are kept by
//! the handles open on it, so what a volume holds is bounded by its cache and its open files,
//! never by every file once opened. Nothing here knows FUSE: the filesystem asks, and does what
//! the answers say.

use std::collections::HashMap;

use crate::content::lazy::Fetched;

/// How an open is to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Through the page cache, whose pages may be kept: the content is the paged one.
    Paged,
    /// By direct I/O: paged handles of other content are open.
    Direct,
    /// After a switch (see [`OpenFiles::begin_switch`]): the paged content is another, or none,
    /// and no paged handle is open.
    Switch,
}

/// One open file.
struct Handle {
    inode: u64,
    content: Fetched,
    paged: bool,
}

/// What the page cache of one file may hold.
#[derive(Default)]
struct Pages {
    /// The paged content's id and size: not the content, which only open handles keep.
    content: Option<(u64, u64)>,
    paged_handles: usize,
    /// Counts switches begun: a switch finishes only if no other began after it.
    switches: u64,
}

/// The open files of one lazy volume.
#[derive(Default)]
pub struct OpenFiles {
    handles: HashMap<u64, Handle>,
    pages: HashMap<u64, Pages>,
    next_handle: u64,
}

/// Whether `content` is the paged content `paged`.
fn is(paged: &Option<(u64, u64)>, content: &Fetched) -> bool {
    paged.is_some_and(|(id, _)| id == content.id)
}

/// The open files of a volume as handed to a successor process: each handle by its number,
/// the inode it reads and the id of the content it reads (the bytes travel apart, once per
/// content), and what each file's page cache may hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenFilesState {
    /// Each open handle.
    pub handles: Vec<HandedHandle>,
    /// What each file's page cache may hold.
    pub pages: Vec<HandedPages>,
    /// The last handle number given.
    pub next_handle: u64,
}

/// One open handle, handed over.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct HandedHandle {
    /// Its number, as the kernel knows it.
    pub handle: u64,
    /// The inode it reads.
    pub inode: u64,
    /// The id of the content it reads.
    pub content: u64,
    /// Whether it reads through the page cache.
    pub paged: bool,
}

/// What one file's page cache may hold, handed over.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct HandedPages {
    /// The file's inode.
    pub inode: u64,
    /// The paged content's id and size.
    pub content: Option<(u64, u64)>,
    /// How many paged handles are open.
    pub paged_handles: usize,
    /// How many switches were begun.
    pub switches: u64,
}

impl OpenFiles {
    /// How an open of `inode` that had `content` is to be answered.
    pub fn mode(&self, inode: u64, content: &Fetched) -> OpenMode {
        let Some(pages) = self.pages.get(&inode) else {
            return OpenMode::Switch;
        };
        if is(&pages.content, content) {
            OpenMode::Paged
        } else if pages.paged_handles > 0 {
            OpenMode::Direct
        } else {
            OpenMode::Switch
        }
    }

    /// Opens `inode` with `content` in `mode` (`Paged` or `Direct`; anything else is opened
    /// `Direct`). `Paged` is honoured only while `content` is still the paged one, else the
    /// handle is direct: whether it is paged, and the handle.
    pub fn open(&mut self, inode: u64, content: Fetched, mode: OpenMode) -> (bool, u64) {
        let pages = self.pages.entry(inode).or_default();
        let paged = mode == OpenMode::Paged && is(&pages.content, &content);
        if paged {
            pages.paged_handles += 1;
        }
        self.next_handle += 1;
        self.handles.insert(self.next_handle, Handle { inode, content, paged });
        (paged, self.next_handle)
    }

    /// Begins changing the paged content of `inode`: `None` when a paged handle is open (the
    /// open is then direct); otherwise the paged content is cleared and the switch's number is
    /// returned, to be given to [`OpenFiles::finish_switch`] once the kernel dropped the file's
    /// pages and attributes.
    pub fn begin_switch(&mut self, inode: u64) -> Option<u64> {
        let pages = self.pages.entry(inode).or_default();
        if pages.paged_handles > 0 {
            return None;
        }
        pages.content = None;
        pages.switches += 1;
        Some(pages.switches)
    }

    /// Makes `content` the paged content of `inode` and opens it paged, if switch `switch` is
    /// the last begun and no paged handle was opened meanwhile; otherwise opens it direct.
    /// Whether it is paged, and the handle.
    pub fn finish_switch(&mut self, inode: u64, switch: u64, content: Fetched) -> (bool, u64) {
        let pages = self.pages.entry(inode).or_default();
        if pages.switches == switch && pages.content.is_none() && pages.paged_handles == 0 {
            pages.content = Some((content.id, content.len() as u64));
            return self.open(inode, content, OpenMode::Paged);
        }
        self.open(inode, content, OpenMode::Direct)
    }

    /// The state a successor needs, and the contents the open handles read, by id.
    pub fn export(&self) -> (OpenFilesState, std::collections::BTreeMap<u64, Fetched>) {
        let mut contents = std::collections::BTreeMap::new();
        let mut handles: Vec<_> = self
            .handles
            .iter()
            .map(|(number, handle)| {
                contents.entry(handle.content.id).or_insert_with(|| handle.content.clone());
                HandedHandle { handle: *number, inode: handle.inode, content: handle.content.id, paged: handle.paged }
            })
            .collect();
        handles.sort_unstable();
        let mut pages: Vec<_> = self
            .pages
            .iter()
            .map(|(inode, pages)| HandedPages {
                inode: *inode,
                content: pages.content,
                paged_handles: pages.paged_handles,
                switches: pages.switches,
            })
            .collect();
        pages.sort_unstable();
        (OpenFilesState { handles, pages, next_handle: self.next_handle }, contents)
    }

    /// The open files a predecessor exported, reading `contents`; an error naming what does not
    /// hold together (a handle whose content is missing, a paged count that is not the count of
    /// paged handles, a handle numbered past the last given).
    pub fn import(
        state: OpenFilesState,
        contents: &std::collections::BTreeMap<u64, Fetched>,
    ) -> Result<OpenFiles, String> {
        let mut open = OpenFiles { next_handle: state.next_handle, ..OpenFiles::default() };
        for HandedPages { inode, content, paged_handles, switches } in state.pages {
            open.pages.insert(inode, Pages { content, paged_handles, switches });
        }
        for HandedHandle { handle: number, inode, content: id, paged } in state.handles {
            if number > state.next_handle {
                return Err(format!("handle {number} is past the last given, {}", state.next_handle));
            }
            let content =
                contents.get(&id).ok_or_else(|| format!("handle {number} reads content {id}, not handed over"))?;
            open.handles.insert(number, Handle { inode, content: content.clone(), paged });
        }
        for (inode, pages) in &open.pages {
            let paged = open.handles.values().filter(|h| h.paged && h.inode == *inode).count();
            if paged != pages.paged_handles {
                return Err(format!("inode {inode} counts {} paged handles, {paged} are open", pages.paged_handles));
            }
        }
        Ok(open)
    }

    /// The content handle `handle` reads.
    pub fn content(&self, handle: u64) -> Option<&[u8]> {
        self.handles.get(&handle).map(|h| &h.content[..])
    }

    /// Closes `handle`.
    pub fn release(&mut self, handle: u64) {
        let Some(closed) = self.handles.remove(&handle) else {
            return;
        };
        if closed.paged
            && let Some(pages) = self.pages.get_mut(&closed.inode)
        {
            pages.paged_handles -= 1;
        }
    }

    /// The size of `inode`'s paged content, which is the only size the kernel may keep for it;
    /// `None` when it has none (then any size told must not be kept).
    pub fn paged_size(&self, inode: u64) -> Option<u64> {
        self.pages.get(&inode)?.content.map(|(_, size)| size)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Content `text`, its id the text's first byte: the same text, the same id, as the lazy
    /// files give a content fetched again unchanged.
    fn content(text: &str) -> Fetched {
        Fetched::detached(u64::from(text.as_bytes()[0]), text.as_bytes())
    }

    /// Opens as the filesystem does: a switch first when asked for.
    fn open(files: &mut OpenFiles, inode: u64, text: &str) -> (bool, u64) {
        let content = content(text);
        match files.mode(inode, &content) {
            OpenMode::Switch => match files.begin_switch(inode) {
                Some(switch) => files.finish_switch(inode, switch, content),
                None => files.open(inode, content, OpenMode::Direct),
            },
            mode => files.open(inode, content, mode),
        }
    }

    #[test]
    fn a_first_open_switches_and_the_next_opens_of_the_same_content_are_paged() {
        let mut files = OpenFiles::default();
        assert_eq!(files.mode(2, &content("a")), OpenMode::Switch);
        let (paged, first) = open(&mut files, 2, "a");
        assert!(paged);
        assert_eq!(files.paged_size(2), Some(1));
        files.release(first);
        // Fetched again unchanged: the same id.
        assert_eq!(files.mode(2, &content("a")), OpenMode::Paged);
        let (paged, second) = open(&mut files, 2, "a");
        assert!(paged);
        assert_eq!(files.content(second), Some(&b"a"[..]));
    }

    #[test]
    fn new_content_is_direct_while_a_paged_handle_of_the_old_is_open_and_switches_after() {
        let mut files = OpenFiles::default();
        let (_, old) = open(&mut files, 2, "old");
        assert_eq!(files.mode(2, &content("newer")), OpenMode::Direct);
        let (paged, new) = open(&mut files, 2, "newer");
        assert!(!paged);
        // The kernel is still told the old content's size: the paged handle reads by it.
        assert_eq!(files.paged_size(2), Some(3));
        assert_eq!(files.content(new), Some(&b"newer"[..]));
        files.release(old);
        files.release(new);
        assert_eq!(files.mode(2, &content("newer")), OpenMode::Switch);
        assert!(open(&mut files, 2, "newer").0);
        assert_eq!(files.paged_size(2), Some(5));
    }

    #[test]
    fn a_switch_clears_the_paged_content_until_it_finishes() {
        let mut files = OpenFiles::default();
        let (_, first) = open(&mut files, 2, "a");
        files.release(first);
        let switch = files.begin_switch(2).expect("no paged handle is open");
        assert_eq!(files.paged_size(2), None);
        // Meanwhile an open of the old content is not paged: its pages are being dropped.
        assert_eq!(files.mode(2, &content("a")), OpenMode::Switch);
        assert!(files.finish_switch(2, switch, content("b")).0);
        assert_eq!(files.paged_size(2), Some(1));
    }

    #[test]
    fn a_switch_overtaken_by_another_opens_direct() {
        let mut files = OpenFiles::default();
        let first = files.begin_switch(2).expect("nothing open");
        let second = files.begin_switch(2).expect("nothing open");
        assert!(files.finish_switch(2, second, content("b")).0);
        let (paged, handle) = files.finish_switch(2, first, content("a"));
        assert!(!paged, "the older switch must not replace the content paged handles read");
        assert_eq!(files.content(handle), Some(&b"a"[..]));
        assert_eq!(files.paged_size(2), Some(1));
        assert_eq!(files.mode(2, &content("b")), OpenMode::Paged);
    }

    #[test]
    fn a_switch_is_refused_while_a_paged_handle_is_open() {
        let mut files = OpenFiles::default();
        let (_, open_handle) = open(&mut files, 2, "a");
        assert_eq!(files.begin_switch(2), None);
        files.release(open_handle);
        assert!(files.begin_switch(2).is_some());
    }

    #[test]
    fn files_are_kept_apart_and_released_handles_forgotten() {
        let mut files = OpenFiles::default();
        let (_, a) = open(&mut files, 2, "a");
        let (_, b) = open(&mut files, 3, "bb");
        assert_eq!((files.paged_size(2), files.paged_size(3)), (Some(1), Some(2)));
        files.release(a);
        files.release(a);
        assert!(files.content(a).is_none());
        assert_eq!(files.content(b), Some(&b"bb"[..]));
        assert_eq!(files.begin_switch(3), None, "b is still open paged");
    }

    #[test]
    fn exported_open_files_imported_elsewhere_answer_as_before() {
        let mut files = OpenFiles::default();
        let (paged, first) = open(&mut files, 5, "alpha");
        assert!(paged);
        let (_, direct) = files.open(5, content("beta"), OpenMode::Direct);
        let (_, other) = open(&mut files, 6, "gamma");
        files.release(other);
        let (state, contents) = files.export();
        assert_eq!(contents.keys().copied().collect::<Vec<_>>(), [u64::from(b'a'), u64::from(b'b')]);
        let imported = OpenFiles::import(state.clone(), &contents).unwrap();
        assert_eq!(imported.content(first), Some(&b"alpha"[..]));
        assert_eq!(imported.content(direct), Some(&b"beta"[..]));
        assert_eq!(imported.content(other), None, "a released handle stays released");
        assert_eq!(imported.paged_size(5), Some(5));
        assert_eq!(imported.export().0, state, "the same state again");
        assert_eq!(imported.mode(5, &content("alpha")), OpenMode::Paged, "the page cache is trusted as before");
    }

    #[test]
    fn open_files_that_do_not_hold_together_are_refused() {
        let mut files = OpenFiles::default();
        open(&mut files, 5, "alpha");
        let (state, contents) = files.export();
        let error = OpenFiles::import(state.clone(), &BTreeMap::new()).err().unwrap();
        assert_eq!(error, "handle 1 reads content 97, not handed over");
        let mut past = state.clone();
        past.next_handle = 0;
        assert_eq!(OpenFiles::import(past, &contents).err().unwrap(), "handle 1 is past the last given, 0");
        let mut miscounted = state;
        miscounted.pages[0].paged_handles = 2;
        assert_eq!(
            OpenFiles::import(miscounted, &contents).err().unwrap(),
            "inode 5 counts 2 paged handles, 1 are open"
        );
    }
}
