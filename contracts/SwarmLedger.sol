// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/**
 * @title SwarmLedger
 * @notice The round ledger of a serverless learning swarm. Peers register (eth address <->
 * libp2p peer id, with the libp2p key's signature checked off chain), commit the digest of the update they published each round together with
 * their cumulative privacy loss, and attest the digest of the aggregate they computed. A strict
 * majority of a round's participants attesting the same (digest, inclusion bitmap) finalizes the
 * round; a round nobody finalizes within the attestation window can be aborted by anyone.
 *
 * Admission: an allowlist the deployer manages, or open. The majority counts the round's
 * committers (at least `minPeers`, fixed at deployment), not the registered or allowed members:
 * with an allowlist every committer is a member the deployer admitted; with open admission anyone
 * may register, so Sybil addresses can decide rounds (`swarm deploy --open` says so). A digest
 * is committed at most once per round (a copied update is refused; not in a swarm deployed for
 * secure aggregation, whose members leave a copied MASKED frame out themselves), and
 * `numSamples`, the FedAvg weight, is capped by `maxSamples`.
 *
 * Privacy accounting: each commit carries two cumulative figures. `epsMicro` is the local
 * mechanism's whole-update epsilon: where the swarm's policy spends a constant amount per release
 * (`epsStepMicro` > 0: pure mechanisms, d x eps per round under basic composition) the contract
 * requires exactly previous + step, so no peer can record less than it spent; otherwise (a
 * Gaussian accounted with RDP) it requires no decrease and peers and verifiers recompute it.
 * `recordEpsMicro` is DP-SGD's record-level epsilon (0 unless the policy trains with DP-SGD),
 * capped by `recordEpsCapMicro`; it depends on the committed sample counts through an accountant
 * no contract can run, so every peer and `swarm verify` recompute it from the Committed events.
 *
 * Rounds: round 1 opens at deployment. When round r is finalized or aborted, round r+1 opens in
 * that same block. A round closes when its commit window has passed or, early, once every member
 * it awaits has committed: every registered member, except those the last finalized aggregate
 * left out (a withholder's blob reaches nobody, so it is left out, and its late commit, trained
 * again from a model it did not expect, no longer holds the round); after an abort, everyone. Every window has a length in blocks and one in seconds (block.timestamp), and
 * ends only once both have passed: on a chain that mines a block per transaction (a local Anvil),
 * anyone can mine hundreds of blocks a second with transactions that fail, so blocks alone would
 * let an outsider close a round on an honest peer or cut the attestation window short; the
 * timestamp does not move with them.
 *
 * Gas layout (why the storage looks the way it does; docs/LEDGER.md "Gas"): in steady state no
 * transaction a peer sends creates a slot (22,100 gas each), and each touches a constant number of
 * slots, whatever the number of peers. A commit rewrites the peer's slot, the live-round slot and one
 * bucket of a hash table of reused slots, the round table, which holds the round's digests while it
 * is open (the duplicate-digest check) and its vote counters once it is closed. Its slots are created
 * by `register` (two per registration) and reused round after round: an entry is tagged with its
 * round and phase, so an entry of an older round or phase is free space. A key is looked for in at
 * most `PROBES` consecutive buckets, then in an overflow mapping (a new slot: round 1, whose table
 * is empty, mid-round registrants in a full table, or an adversary filling a victim's buckets), so
 * no transaction loops over peers. The participant order (the order inclusion bitmaps use) is the
 * `index` of the Committed events, checked against the stored participant count. An attestation
 * rewrites the peer's slot and one bucket; `closeRound` pre-writes the round's outcome slot so the
 * finalizing attestation only overwrites it. Who the early close awaits costs a commit one cold read
 * (the word of the last finalized bitmap holding the sender's bit) and the finalizing attestation
 * one rewritten slot per 256 participants (that bitmap, in slots reused every other finalization),
 * paid by not writing the finalizer's vote counter and attestation mark, which nobody reads again.
 */
contract SwarmLedger {
    // ------------------------------------------------------------------ types

    /// @notice Life cycle of a round: OPEN -> CLOSED -> FINALIZED or ABORTED.
    enum RoundState {
        OPEN,
        CLOSED,
        FINALIZED,
        ABORTED
    }

    /// @notice Swarm parameters, fixed at deployment.
    struct Params {
        uint32 minPeers;
        uint64 commitWindow;
        uint64 attestWindow;
        uint64 epsCapMicro;
        uint64 deltaE18;
        uint64 epsStepMicro;
        uint64 recordEpsCapMicro;
        uint64 recordDeltaE18;
        bytes32 genesisDigest;
        bool allowlistEnabled;
        address deployer;
        uint64 deployBlock;
        uint32 maxSamples;
        uint32 commitWindowSeconds;
        uint32 attestWindowSeconds;
        bool secureAggregation;
    }

    /// @notice The numeric parameters given at deployment.
    struct Settings {
        uint32 minPeers; // quorum: commitments needed before a round can close (>= 1)
        uint64 commitWindow; // blocks after a round opens during which it takes commitments (>= 1)
        uint64 attestWindow; // blocks after a round closes before anyone may abort it (>= 1)
        uint64 epsCapMicro; // cap on each peer's cumulative epsilon, in millionths
        uint64 deltaE18; // the swarm's delta, in units of 1e-18 (1e-5 -> 1e13)
        uint64 epsStepMicro; // what one release spends under the policy (0: not constant)
        uint64 recordEpsCapMicro; // cap on each peer's record-level (DP-SGD) epsilon; 0 = no DP-SGD
        uint64 recordDeltaE18; // the record-level delta, in units of 1e-18 (0 without DP-SGD)
        uint32 maxSamples; // cap on a commit's numSamples (the FedAvg weight); 0 = 2^32 - 1
        uint32 commitWindowSeconds; // seconds the commit window also lasts, by block.timestamp (>= 1)
        uint32 attestWindowSeconds; // seconds the attestation window also lasts, by block.timestamp (>= 1)
        bool secureAggregation; // rounds are secure-aggregation rounds: postFrame, acknowledge and complain taken, commits not deduplicated
    }

    /// @notice What a view returns about one round.
    struct RoundInfo {
        RoundState state;
        uint64 openedBlock;
        uint64 closedBlock; // 0 while open
        uint64 endedBlock; // block the round was finalized or aborted in; 0 while open or closed
        uint32 participantCount;
        bytes32 finalizedDigest; // 0 unless finalized
        uint64 openedAt; // block.timestamp of openedBlock
        uint64 closedAt; // block.timestamp of closedBlock; 0 while open
    }

    /// @dev One slot per registered address (240 bits); `lastCommitRound`/`lastAttestRound` detect a
    /// second commit or attestation without a per-round slot; `lastCommitRound` and
    /// `lastCommitIndex` (its participant number there) find the peer's bit in that round's
    /// finalized inclusion bitmap (who the early close awaits: `_leftOut`).
    struct Peer {
        uint64 epsMicro;
        uint64 recordEpsMicro;
        uint32 lastCommitRound;
        uint32 lastAttestRound;
        bool registered;
        bool banned;
        uint32 lastCommitIndex;
    }

    /// @dev The round in progress, in one slot (256 bits): commits and attestations read it, commits
    /// bump `participantCount` and `settled`. Rounds fit 31 bits (the table's tags), blocks 40 bits
    /// (34,000 years of one-second blocks) and timestamps 40 bits (until the year 36,000). The slot
    /// holds where the round's current phase began, the one window that can still be running: the
    /// opening while it is open (the commit window), the closing once it is closed (the attestation
    /// window); the opening of a closed round is in its RoundRecord. The early close (closeRound)
    /// waits until `settled` reaches the registered count; `settled` and `leftOutAbsent` may only
    /// count low (saturating), which makes a round wait longer, never close without a member it awaits.
    struct Live {
        uint32 round;
        uint40 sinceBlock; // block the round opened in (OPEN) or closed in (CLOSED)
        uint40 sinceTime; // that block's timestamp
        uint32 baseRound; // last finalized round (0 = genesis): the model this round starts from
        uint24 participantCount;
        RoundState state;
        bool priorKept; // the round before the base was finalized too: its bitmap still decides (`_leftOut`)
        bool committerRemoved; // a participant of this round was removed since: its bitmap counts as all ones
        uint24 settled; // members that can still commit and committed, or that the early close does not await
        uint24 tableSize; // buckets of the round table this round uses (set at the previous close, and at this one for the votes)
        uint16 leftOutAbsent; // members the base round left out that have not committed in this round
    }

    /// @dev Written once when a round closes, in one slot (192 bits); endedBlock of r is openedBlock of r+1.
    struct RoundRecord {
        uint40 openedBlock;
        uint40 closedBlock;
        uint32 participantCount;
        uint40 openedAt;
        uint40 closedAt;
    }

    /// @dev Registration counters, one slot.
    struct Counts {
        uint32 registered; // registered addresses that can still commit (not removed from the allowlist)
        uint32 tableSlots; // round-table slots created by registrations (2 each)
    }

    // ------------------------------------------------------------------ errors

    /// @notice A constructor parameter is out of range.
    error InvalidParams(string name);
    /// @notice Only the deployer may manage the allowlist.
    error NotDeployer(address sender);
    /// @notice The swarm has an allowlist and `account` is not (or no longer) on it.
    error NotAllowed(address account);
    /// @notice The sender is not registered.
    error NotRegistered(address account);
    /// @notice The sender is already registered.
    error AlreadyRegistered(address account);
    /// @notice A peer id must be 1 to 128 bytes long.
    error InvalidPeerId(uint256 length);
    /// @notice A registration signature must be at most 128 bytes long.
    error InvalidSignature(uint256 length);
    /// @notice The round given is not the current round.
    error WrongRound(uint64 given, uint64 current);
    /// @notice The sender already committed in this round.
    error AlreadyCommitted(uint64 round, address peer);
    /// @notice The round no longer takes commitments (closed, or window over with quorum).
    error CommitWindowClosed(uint64 round);
    /// @notice The commit window lasts through block `lastBlock` and until timestamp `endsAt`: it
    /// is over in a block numbered above `lastBlock` whose timestamp is at least `endsAt`.
    error CommitWindowOpen(uint64 round, uint64 lastBlock, uint64 endsAt);
    /// @notice Fewer than `minPeers` committed: the window extends until quorum.
    error QuorumNotMet(uint64 round, uint32 committed, uint32 minPeers);
    /// @notice Cumulative epsilon may not decrease.
    error EpsDecreasing(uint64 previousMicro, uint64 givenMicro);
    /// @notice The policy spends exactly `expectedMicro` by this commit; `givenMicro` was committed.
    error EpsNotPolicy(uint64 expectedMicro, uint64 givenMicro);
    /// @notice The record-level epsilon may not decrease.
    error RecordEpsDecreasing(uint64 previousMicro, uint64 givenMicro);
    /// @notice The record-level epsilon would pass its cap (0: the policy has no DP-SGD).
    error RecordEpsOverCap(uint64 givenMicro, uint64 capMicro);
    /// @notice Cumulative epsilon may not pass the swarm's cap.
    error EpsOverCap(uint64 givenMicro, uint64 capMicro);
    /// @notice A digest must not be 0 or 1 (1 marks a closed, not finalized, round).
    error InvalidDigest(bytes32 digest);
    /// @notice numSamples must be at least 1.
    error InvalidNumSamples(uint64 numSamples);
    /// @notice numSamples may not pass the swarm's `maxSamples` (the FedAvg weight is capped).
    error NumSamplesOverCap(uint64 numSamples, uint32 maxSamples);
    /// @notice Another participant already committed `digest` in `round` (a copied update).
    error DuplicateDigest(uint64 round, bytes32 digest);
    /// @notice The round is not open.
    error RoundNotOpen(uint64 round, RoundState state);
    /// @notice The round is not closed (still open, or already finalized or aborted).
    error RoundNotClosed(uint64 round, RoundState state);
    /// @notice Only the round's participants may attest.
    error NotParticipant(uint64 round, address account);
    /// @notice The sender already attested in this round.
    error AlreadyAttested(uint64 round, address peer);
    /// @notice An attestation's bitmap must be `expectedLength` = ceil(participants / 8) bytes with
    /// no bit set past the last participant; an acknowledgment's at most `expectedLength` = 512.
    error MalformedBitmap(uint64 round, uint256 length, uint256 expectedLength);
    /// @notice The attestation window lasts through block `lastBlock` and until timestamp `endsAt`:
    /// it is over in a block numbered above `lastBlock` whose timestamp is at least `endsAt`.
    error AbortTooEarly(uint64 round, uint64 lastBlock, uint64 endsAt);
    /// @notice A finalized round cannot be aborted.
    error RoundAlreadyFinalized(uint64 round);
    /// @notice `step` is not a secure-aggregation step posted with postFrame (0 KEYS, 1 DEALING,
    /// 3 REVEAL; the MASKED frame's digest is the commit) or acknowledged with acknowledge (0 KEYS,
    /// 1 DEALING, 2 MASKED).
    error InvalidStep(uint8 step);
    /// @notice `round` is not in `step`'s window now (see postFrame): it is over (it lasted through
    /// block `lastBlock` and until timestamp `endsAt`), or it has not begun (both 0). A KEYS or
    /// DEALING posting after the round closed is refused with RoundNotOpen.
    error StepWindowClosed(uint64 round, uint8 step, uint64 lastBlock, uint64 endsAt);
    /// @notice The sender already posted (postFrame, acknowledge) for `step` of `round`: one posting
    /// per member and step, so nobody can make every member re-read a stream of postings.
    error AlreadyPosted(uint64 round, uint8 step, address peer);
    /// @notice This swarm was not deployed for secure aggregation (`Settings.secureAggregation`).
    error NotSecureAggregation();
    /// @notice A COMPLAINT frame of `length` bytes: it must be 1 to `maxLength` bytes (the
    /// largest COMPLAINT frame the protocol's messages allow).
    error InvalidComplaint(uint64 round, uint256 length, uint256 maxLength);

    // ------------------------------------------------------------------ events

    /// @notice `account` was added to (true) or removed from (false) the allowlist.
    event AllowlistChanged(address indexed account, bool allowed);
    /// @notice `peer` registered with libp2p peer id `peerId` and `signature`, the libp2p key's
    /// signature over (chain id, ledger, peer) that peers and verifiers check off chain.
    event Registered(address indexed peer, bytes peerId, bytes signature);
    /// @notice A round opened at deployment (round 1) or after an abort; it starts from the model
    /// finalized in `baseRound` (0 = genesis). After a finalization, RoundFinalized(r) is the event
    /// that round r + 1 opened from r's aggregate (no RoundOpened: 1,700 gas the finalizer saves).
    event RoundOpened(uint64 indexed round, uint64 baseRound, bytes32 baseDigest);
    /// @notice `peer` committed the update `digest` as participant number `index`.
    event Committed(
        uint64 indexed round,
        address indexed peer,
        uint32 index,
        bytes32 digest,
        uint64 numSamples,
        uint64 epsMicro,
        uint64 recordEpsMicro,
        bytes mechanism
    );
    /// @notice The round closed: its participant list is final.
    event RoundClosed(uint64 indexed round, uint32 participantCount);
    /// @notice `peer` attested (`aggregateDigest`, `included`), which now has `votes` votes.
    event Attested(uint64 indexed round, address indexed peer, bytes32 aggregateDigest, bytes included, uint32 votes);
    /// @notice A strict majority agreed on `aggregateDigest` (its bitmap is in the Attested event of the
    /// same transaction, the last of the round); attesters of anything else are the dissenters. Round
    /// `round` + 1 opens in the same transaction from this aggregate.
    event RoundFinalized(uint64 indexed round, bytes32 aggregateDigest, uint32 votes);
    /// @notice The attestation window passed without a majority.
    event RoundAborted(uint64 indexed round, address indexed by);
    /// @notice `peer` posted the digest of its frame for secure-aggregation step `step` of
    /// `round` within that step's window; the first posting per (round, step, peer) is the one
    /// that counts (peers and verifiers ignore later ones).
    event FramePosted(uint64 indexed round, address indexed peer, uint8 step, bytes32 digest);
    /// @notice `peer` holds the frames of step `step` (0 KEYS, 1 DEALING, 2 MASKED) of the members
    /// whose bits `fetched` sets (member i: byte i / 8, bit i % 8, as inclusion bitmaps), posted in
    /// that step's acknowledgment window of secure round `round`.
    event Acknowledged(uint64 indexed round, address indexed peer, uint8 step, bytes fetched);
    /// @notice `peer` complained, in the complaint window of secure round `round`, against the
    /// dealers its signed COMPLAINT `frame` names (each with the peer's private key of that pair:
    /// anyone judges it against the dealer's bundle). The frame itself is the record.
    event Complained(uint64 indexed round, address indexed peer, bytes frame);

    // ------------------------------------------------------------------ storage

    /// @dev Marks a slot as created but empty: a round closed and not finalized. Never a valid
    /// digest (sha256 output 1 is not a concern).
    bytes32 private constant RESERVED = bytes32(uint256(1));

    uint32 private immutable _minPeers;
    uint64 private immutable _commitWindow;
    uint64 private immutable _attestWindow;
    uint64 private immutable _epsCapMicro;
    uint64 private immutable _deltaE18;
    uint64 private immutable _epsStepMicro;
    uint64 private immutable _recordEpsCapMicro;
    uint64 private immutable _recordDeltaE18;
    bytes32 private immutable _genesisDigest;
    bool private immutable _allowlistEnabled;
    address private immutable _deployer;
    uint64 private immutable _deployBlock;
    uint32 private immutable _maxSamples;
    uint32 private immutable _commitWindowSeconds;
    uint32 private immutable _attestWindowSeconds;
    bool private immutable _secureAggregation;

    /// @dev Buckets looked at for a key before the overflow mapping.
    uint256 private constant PROBES = 3;
    /// @dev Round-table slots each registration creates.
    uint256 private constant SLOTS_PER_REGISTRATION = 2;
    uint256 private constant MASK74 = (1 << 74) - 1;
    /// @dev Secure-aggregation steps (postFrame's 0, 1 and 3, the commit's 2), the acknowledgments
    /// of steps 0, 1 and 2 (acknowledge's step + 4 for a frame step s: bit s + 4 of a `_posted` slot)
    /// and the complaints (complain: bit 7).
    uint8 private constant KEYS = 0;
    uint8 private constant DEALING = 1;
    uint8 private constant MASKED = 2;
    uint8 private constant REVEAL = 3;
    uint8 private constant ACK_KEYS = 4;
    uint8 private constant ACK_DEALING = 5;
    uint8 private constant ACK_MASKED = 6;
    uint8 private constant COMPLAINT = 7;
    /// @dev An acknowledgment's bitmap: 4,096 members at most (what a frame can address).
    uint256 private constant MAX_ACK_BYTES = 512;
    /// @dev A COMPLAINT frame (mechanisms/secagg/messages.py `max_complaint_bytes`): header, session
    /// and sender, a count and a signature (111 bytes), then an entry of a dealer and a 32-byte key
    /// (34 bytes) per dealer it names, at most one per member and 4,096 (what a frame can address).
    uint256 private constant COMPLAINT_FIXED_BYTES = 111;
    uint256 private constant COMPLAINT_ENTRY_BYTES = 34;
    uint256 private constant MAX_COMPLAINT_ENTRIES = 4096;

    Live private _live;
    mapping(address => Peer) private _peers;
    mapping(address => bytes) private _peerIds;
    mapping(address => bool) private _allowed;
    /// @dev The round table: bucket -> entry. Bits 224..255 are a tag, round * 2 + phase; a bucket
    /// whose tag is not the caller's (round, phase) is free. Phase 0 (open round): up to three digest
    /// fingerprints of 74 bits each, bits 148..221, 74..147 and 0..73 (0 = empty). Phase 1 (closed
    /// round): one vote counter, bits 32..223 a fingerprint of keccak256(aggregateDigest, included),
    /// bits 0..31 its votes. A registration writes 1 (tag 0: free) into its two new slots.
    mapping(uint256 => uint256) private _table;
    /// @dev Keys that found `PROBES` full buckets: keccak256(round, phase, key) -> 1 (a digest) or votes.
    mapping(bytes32 => uint256) private _overflow;
    mapping(uint64 => RoundRecord) private _records;
    /// @dev RESERVED from closeRound, then the aggregate digest if finalized.
    mapping(uint64 => bytes32) private _outcome;
    Counts private _counts;
    /// @dev The winning inclusion bitmaps of the last two finalized rounds, in reused slots: key
    /// (word << 1) | (round & 1), word w holding bytes 32w..32w+31 of the bitmap as calldataload
    /// reads them (participant i: byte i / 8, bit i % 8). Which round a parity holds is in the live
    /// slot (`baseRound`, `priorKept`): written by the finalizing attestation, read by commits,
    /// `allow` and `disallow`. Slots created by the constructor (word 0) and by every 256th
    /// registration (the next word), so that no finalization creates one.
    mapping(uint256 => uint256) private _included;
    /// @dev Secure aggregation, one slot per member that ever posted, reused round after round
    /// (created by its first posting, 22,100 gas once; rewritten by each later one): bits 8..255 the
    /// round of its last posting, bits 0..7 the steps (1 << step) it posted in that round.
    mapping(address => uint256) private _posted;

    // ------------------------------------------------------------------ setup

    /**
     * @param settings the swarm's numeric parameters (one struct: thirteen loose constructor
     * arguments do not fit the EVM stack when decoded)
     * @param genesisDigest digest of the initial model round 1 starts from
     * @param allowlist if non-empty, only these addresses (and those the deployer adds) may register
     */
    constructor(Settings memory settings, bytes32 genesisDigest, address[] memory allowlist) {
        if (settings.minPeers == 0) revert InvalidParams("minPeers");
        if (settings.commitWindow == 0) revert InvalidParams("commitWindow");
        if (settings.attestWindow == 0) revert InvalidParams("attestWindow");
        // A window of 0 seconds would be blocks only: as short as the chain lets anyone mine blocks.
        if (settings.commitWindowSeconds == 0) revert InvalidParams("commitWindowSeconds");
        if (settings.attestWindowSeconds == 0) revert InvalidParams("attestWindowSeconds");
        if (settings.epsCapMicro == 0) revert InvalidParams("epsCapMicro");
        if (settings.deltaE18 >= 1e18) revert InvalidParams("deltaE18");
        if (settings.epsStepMicro > settings.epsCapMicro) revert InvalidParams("epsStepMicro");
        if (
            settings.recordDeltaE18 >= 1e18 || (settings.recordEpsCapMicro > 0) != (settings.recordDeltaE18 > 0)
        ) revert InvalidParams("recordDeltaE18");
        if (uint256(genesisDigest) <= 1) revert InvalidParams("genesisDigest");
        _minPeers = settings.minPeers;
        _commitWindow = settings.commitWindow;
        _attestWindow = settings.attestWindow;
        _epsCapMicro = settings.epsCapMicro;
        _deltaE18 = settings.deltaE18;
        _epsStepMicro = settings.epsStepMicro;
        _recordEpsCapMicro = settings.recordEpsCapMicro;
        _recordDeltaE18 = settings.recordDeltaE18;
        _maxSamples = settings.maxSamples == 0 ? type(uint32).max : settings.maxSamples;
        _commitWindowSeconds = settings.commitWindowSeconds;
        _attestWindowSeconds = settings.attestWindowSeconds;
        _secureAggregation = settings.secureAggregation;
        _genesisDigest = genesisDigest;
        _allowlistEnabled = allowlist.length > 0;
        _deployer = msg.sender;
        _deployBlock = uint64(block.number);
        for (uint256 i = 0; i < allowlist.length; ++i) {
            _allowed[allowlist[i]] = true;
            emit AllowlistChanged(allowlist[i], true);
        }
        _live = Live({
            round: 1,
            sinceBlock: uint40(block.number),
            sinceTime: uint40(block.timestamp),
            baseRound: 0,
            participantCount: 0,
            state: RoundState.OPEN,
            priorKept: false,
            committerRemoved: false,
            settled: 0,
            tableSize: 0, // nobody registered yet: round 1's keys all go to the overflow mapping
            leftOutAbsent: 0
        });
        // word 0 of both bitmaps (participants 0..255): rewritten by every finalization, never created by one
        _included[0] = 1;
        _included[1] = 1;
        emit RoundOpened(1, 0, genesisDigest);
    }

    // ------------------------------------------------------------------ admission

    /**
     * @notice Add addresses to the allowlist (deployer only; only if deployed with one). A removed
     * registered peer that is allowed again can commit again and counts for early close again (as
     * awaited as it would be had it never been removed; a round whose participant was removed keeps
     * counting its bitmap as all ones).
     * @param accounts addresses that may register
     */
    function allow(address[] calldata accounts) external {
        if (msg.sender != _deployer) revert NotDeployer(msg.sender);
        if (!_allowlistEnabled) revert InvalidParams("allowlist");
        Live memory live = _live;
        for (uint256 i = 0; i < accounts.length; ++i) {
            Peer storage peer = _peers[accounts[i]];
            if (peer.registered && peer.banned) {
                _counts.registered += 1;
                _settle(live, peer, true);
            }
            _allowed[accounts[i]] = true;
            peer.banned = false;
            emit AllowlistChanged(accounts[i], true);
        }
        _writeLive(live);
    }

    /**
     * @notice Remove an address from the allowlist (deployer only). A registered peer that is
     * removed can no longer commit nor attest, and no round waits for it (it leaves
     * `registeredCount`, and its commitment in the live round no longer counts for early close);
     * commitments it already made stay in their rounds' participant lists.
     * @param account the address to remove
     */
    function disallow(address account) external {
        if (msg.sender != _deployer) revert NotDeployer(msg.sender);
        if (!_allowlistEnabled) revert InvalidParams("allowlist");
        Peer storage peer = _peers[account];
        if (peer.registered && !peer.banned) {
            _counts.registered -= 1;
            Live memory live = _live;
            _settle(live, peer, false);
            _writeLive(live);
        }
        _allowed[account] = false;
        peer.banned = true;
        emit AllowlistChanged(account, false);
    }

    /**
     * @dev Count a registered peer in (`back`: allowed again) or out (removed) of the live round's
     * early-close tallies in `live`: a peer that committed in it, or that it does not await, is in
     * `settled`; one the base round left out and not committed yet is in `leftOutAbsent`. A
     * participant removed in its own round makes that round's bitmap count as all ones at
     * finalization (its bit there cannot be told apart from the others' without a loop), so the
     * next round awaits everyone the bitmap left out: waiting longer, never less.
     */
    function _settle(Live memory live, Peer storage peer, bool back) private view {
        if (peer.lastCommitRound == live.round) {
            live.settled = back ? _up24(live.settled) : _down24(live.settled);
            if (!back) live.committerRemoved = true;
            return;
        }
        (bool unawaited, bool ofBase) = _leftOut(live, peer.lastCommitRound, peer.lastCommitIndex);
        if (unawaited) live.settled = back ? _up24(live.settled) : _down24(live.settled);
        if (ofBase) live.leftOutAbsent = back ? _up16(live.leftOutAbsent) : _down16(live.leftOutAbsent);
    }

    /**
     * @notice Register the sender with its libp2p peer id, once per address.
     * @dev The contract cannot check `signature` (libp2p keys are Ed25519, secp256k1 or RSA, not
     * Ethereum's): it is only emitted. Peers and verifiers check it off chain against the key in
     * the peer id, over "swarm-ledger/register/v1" || chain id (32 bytes) || this contract (20) ||
     * sender (20), and resolve a peer id to the first registration whose signature verifies. So
     * a peer id is not unique on chain: a squatter registering another peer's id, unable to sign
     * for it, cannot block the owner's registration and is ignored everywhere.
     * @param peerId the libp2p peer id bytes (multihash), 1 to 128 bytes
     * @param signature the peer id's key's signature over the message above, at most 128 bytes
     */
    function register(bytes calldata peerId, bytes calldata signature) external {
        if (_allowlistEnabled && !_allowed[msg.sender]) revert NotAllowed(msg.sender);
        Peer storage peer = _peers[msg.sender];
        if (peer.registered) revert AlreadyRegistered(msg.sender);
        if (peerId.length == 0 || peerId.length > 128) revert InvalidPeerId(peerId.length);
        if (signature.length > 128) revert InvalidSignature(signature.length);
        _peerIds[msg.sender] = peerId;
        peer.registered = true;
        Counts memory counts = _counts;
        // The two round-table slots this peer's commits and votes will reuse every round: created
        // here (20,000 gas each, once) so that no commit or attestation creates one.
        _table[counts.tableSlots] = 1;
        _table[counts.tableSlots + 1] = 1;
        // every 256th registration: the next word of both inclusion bitmaps (word 0: the constructor)
        uint256 registrations = counts.tableSlots / SLOTS_PER_REGISTRATION;
        if (registrations % 256 == 0 && registrations > 0) {
            _included[(registrations / 256) << 1] = 1;
            _included[((registrations / 256) << 1) | 1] = 1;
        }
        _counts = Counts(counts.registered + 1, counts.tableSlots + uint32(SLOTS_PER_REGISTRATION));
        emit Registered(msg.sender, peerId, signature);
    }

    // ------------------------------------------------------------------ rounds

    /**
     * @notice Commit the digest of the update the sender published for `round`.
     * @dev Accepted while the round is open and either the commit window has not passed (its
     * blocks or its seconds) or the quorum is not reached yet (the window extends). The epsilon is
     * spent from here on. A digest another participant already committed in the round is refused
     * (DuplicateDigest), except in a swarm deployed for secure aggregation: there the digest is of
     * a MASKED frame signed by and naming its sender, so a copy names its copier, and refusing the
     * original would let a copier that commits first push its sender out of the round.
     * @param round the current round
     * @param digest sha256 of the published update blob
     * @param numSamples local training samples (aggregation weight), 1 to maxSamples
     * @param epsMicro the sender's cumulative whole-update epsilon after this round, in millionths
     * @param recordEpsMicro the sender's cumulative record-level (DP-SGD) epsilon, in millionths
     * @param mechanism canonical JSON of the mechanism parameters (kept in the event only)
     */
    function commit(
        uint64 round,
        bytes32 digest,
        uint64 numSamples,
        uint64 epsMicro,
        uint64 recordEpsMicro,
        bytes calldata mechanism
    ) external {
        Peer memory peer = _peers[msg.sender];
        if (!peer.registered) revert NotRegistered(msg.sender);
        if (peer.banned) revert NotAllowed(msg.sender);
        Live memory live = _live;
        if (round != live.round) revert WrongRound(round, live.round);
        if (peer.lastCommitRound == round) revert AlreadyCommitted(round, msg.sender);
        if (live.state != RoundState.OPEN) revert CommitWindowClosed(round);
        if (live.participantCount >= _minPeers) {
            (bool passed, , ) = _window(live.sinceBlock, live.sinceTime, _commitWindow, _commitWindowSeconds);
            if (passed) revert CommitWindowClosed(round);
        }
        if (_epsStepMicro > 0) {
            uint64 expected = peer.epsMicro + _epsStepMicro;
            if (epsMicro != expected) revert EpsNotPolicy(expected, epsMicro);
        } else if (epsMicro < peer.epsMicro) revert EpsDecreasing(peer.epsMicro, epsMicro);
        if (epsMicro > _epsCapMicro) revert EpsOverCap(epsMicro, _epsCapMicro);
        if (recordEpsMicro < peer.recordEpsMicro) revert RecordEpsDecreasing(peer.recordEpsMicro, recordEpsMicro);
        if (recordEpsMicro > _recordEpsCapMicro) revert RecordEpsOverCap(recordEpsMicro, _recordEpsCapMicro);
        if (uint256(digest) <= 1) revert InvalidDigest(digest);
        if (numSamples == 0) revert InvalidNumSamples(numSamples);
        if (numSamples > _maxSamples) revert NumSamplesOverCap(numSamples, _maxSamples);
        // Secure aggregation: a MASKED frame names and is signed by its sender, so a copied digest
        // names its copier (members leave it out); refusing the copy would let a copier that
        // commits first push its victim out of the round.
        if (!_secureAggregation && !_insertDigest(round, digest, live.tableSize)) {
            revert DuplicateDigest(round, digest);
        }

        uint32 index = live.participantCount;
        // 2^24 - 1 participants fill the 24-bit count: the round takes no more (never seen: a guard)
        if (index == type(uint24).max) revert CommitWindowClosed(round);
        // Whether the early close awaited this commit, from the peer's previous one (overwritten next).
        (bool unawaited, bool ofBase) = _leftOut(live, peer.lastCommitRound, peer.lastCommitIndex);
        // The peer's slot in one SSTORE (assigned field by field, the compiler writes it six times:
        // 1,800 gas more). Peer's layout, lowest bits first: epsMicro, recordEpsMicro,
        // lastCommitRound, lastAttestRound, registered (true), banned (false, checked above),
        // lastCommitIndex.
        uint256 packed = uint256(epsMicro) |
            (uint256(recordEpsMicro) << 64) |
            (uint256(round) << 128) |
            (uint256(peer.lastAttestRound) << 160) |
            (1 << 192) |
            (uint256(index) << 208);
        Peer storage stored = _peers[msg.sender];
        assembly ("memory-safe") {
            sstore(stored.slot, packed)
        }
        // The live slot, added to in place (its layout: `_writeLive`): one more participant, one
        // more settled member if the early close awaited this one, one fewer absent left-out
        // member if the base round left it out. The tallies saturate (they may count low).
        uint256 delta = 1 << 144;
        if (!unawaited && live.settled != type(uint24).max) delta += 1 << 192;
        Live storage slot = _live;
        assembly ("memory-safe") {
            sstore(slot.slot, add(sload(slot.slot), delta))
        }
        if (ofBase && live.leftOutAbsent != 0) _live.leftOutAbsent = live.leftOutAbsent - 1;
        emit Committed(round, msg.sender, index, digest, numSamples, epsMicro, recordEpsMicro, mechanism);
    }

    /**
     * @notice Close `round` (anyone): at least `minPeers` committed, and either the commit
     * window has passed (its blocks and its seconds) or every member the round awaits has
     * committed (nobody is left to wait for). A round awaits every registered peer that can still
     * commit (peers removed from the allowlist count neither as committed nor as awaited) except,
     * when the round before it was finalized, the members that round's winning bitmap left out
     * (their blob did not reach the majority: withheld, or its holder down), and, when the round
     * before that was finalized too, the members it left out that did not commit since. Who is
     * awaited is decided per member (its participant number and that bitmap), never by a count
     * anyone could fill with commits of its own; and an early close also needs more than two
     * thirds of the registered members committed, so members left out of one round never let
     * fewer than that decide the next one early. The participant list is final from here.
     * @param round the current round
     */
    function closeRound(uint64 round) external {
        Live memory live = _live;
        if (round != live.round) revert WrongRound(round, live.round);
        if (live.state != RoundState.OPEN) revert RoundNotOpen(round, live.state);
        Counts memory counts = _counts;
        (bool passed, uint64 lastBlock, uint64 endsAt) = _window(
            live.sinceBlock,
            live.sinceTime,
            _commitWindow,
            _commitWindowSeconds
        );
        // Early, also only while more than two thirds of the registered members committed: once
        // members are left out, the ones still awaited could otherwise be a colluding minority that
        // closes rounds on itself before restarted honest members get their commits in.
        if (
            !passed &&
            (live.settled < counts.registered || 3 * uint256(live.participantCount) <= 2 * uint256(counts.registered))
        ) revert CommitWindowOpen(round, lastBlock, endsAt);
        if (live.participantCount < _minPeers) revert QuorumNotMet(round, live.participantCount, _minPeers);
        _live.state = RoundState.CLOSED;
        _live.sinceBlock = uint40(block.number);
        _live.sinceTime = uint40(block.timestamp);
        // The table of this round's votes and the next round's digests: every slot registrations
        // created so far (the digests' phase is over: their buckets need not be found again).
        _live.tableSize = counts.tableSlots > type(uint24).max ? type(uint24).max : uint24(counts.tableSlots);
        _records[round] = RoundRecord(
            live.sinceBlock,
            uint40(block.number),
            live.participantCount,
            live.sinceTime,
            uint40(block.timestamp)
        );
        _outcome[round] = RESERVED;
        emit RoundClosed(round, live.participantCount);
    }

    /**
     * @notice Attest the aggregate the sender computed for a closed round (participants only,
     * once, and not after removal from the allowlist). A strict majority of participants attesting the same (digest, bitmap) finalizes the
     * round and opens the next one from that model.
     * @param round the current round, closed
     * @param aggregateDigest sha256 of the aggregate model
     * @param included bitmap over participants(round): bit i (lowest bit of byte 0 first) set if
     * participant i's blob went into the aggregate; exactly ceil(participants / 8) bytes
     */
    function attest(uint64 round, bytes32 aggregateDigest, bytes calldata included) external {
        Live memory live = _live;
        if (round == 0 || round > live.round) revert WrongRound(round, live.round);
        if (round < live.round) revert RoundNotClosed(round, _pastState(round));
        if (live.state != RoundState.CLOSED) revert RoundNotClosed(round, live.state);
        Peer storage peer = _peers[msg.sender];
        if (peer.lastCommitRound != round) revert NotParticipant(round, msg.sender);
        if (peer.banned) revert NotAllowed(msg.sender);
        if (peer.lastAttestRound == round) revert AlreadyAttested(round, msg.sender);
        if (uint256(aggregateDigest) <= 1) revert InvalidDigest(aggregateDigest);
        uint256 count = live.participantCount;
        uint256 expected = (count + 7) / 8;
        if (included.length != expected || (count % 8 != 0 && uint8(included[expected - 1]) >> (count % 8) != 0)) {
            revert MalformedBitmap(round, included.length, expected);
        }
        uint32 votes = _vote(round, keccak256(abi.encodePacked(aggregateDigest, included)), live.tableSize, count);
        emit Attested(round, msg.sender, aggregateDigest, included, votes);
        if (2 * uint256(votes) <= count) {
            peer.lastAttestRound = uint32(round);
            return;
        }
        // The majority: nobody attests this round again (it is no longer closed), so neither the
        // sender's lastAttestRound nor the vote counter is written (5,800 gas this transaction
        // spends on the bitmap instead).
        _outcome[round] = aggregateDigest;
        emit RoundFinalized(round, aggregateDigest, votes);
        uint256 leftOut = _keepIncluded(uint32(round), included, count, live.committerRemoved);
        _writeLive(Live({
            round: live.round + 1,
            sinceBlock: uint40(block.number),
            sinceTime: uint40(block.timestamp),
            baseRound: uint32(round),
            participantCount: 0,
            state: RoundState.OPEN,
            priorKept: live.baseRound != 0 && live.baseRound + 1 == round,
            committerRemoved: false,
            // not awaited: those this round left out, and those its base left out that sat it out
            settled: uint24(_min(leftOut + live.leftOutAbsent, type(uint24).max)),
            tableSize: live.tableSize,
            leftOutAbsent: uint16(_min(leftOut, type(uint16).max))
        }));
    }

    /**
     * @notice Abort a closed round nobody finalized within the attestation window, its blocks and
     * its seconds (anyone). On a secure-aggregation ledger also an open round that never reached
     * `minPeers` commits once its commit window and an attestation window after it have passed
     * (members that sat out of a step of the protocol never commit, so it could never close). The
     * next round starts from the last finalized model; epsilon committed here stays spent.
     * @param round the current round, closed with its attestation window passed (or, secure
     * aggregation only, open without quorum past both windows)
     */
    function abortRound(uint64 round) external {
        Live memory live = _live;
        if (round == 0 || round > live.round) revert WrongRound(round, live.round);
        if (round < live.round) {
            RoundState past = _pastState(round);
            if (past == RoundState.FINALIZED) revert RoundAlreadyFinalized(round);
            revert RoundNotClosed(round, past);
        }
        bool passed;
        uint64 lastBlock;
        uint64 endsAt;
        if (live.state == RoundState.OPEN) {
            // without quorum only: a round that has it is closed (closeRound), not aborted
            if (!_secureAggregation || live.participantCount >= _minPeers) revert RoundNotClosed(round, live.state);
            (passed, lastBlock, endsAt) = _window(
                live.sinceBlock,
                live.sinceTime,
                _commitWindow + _attestWindow,
                uint32(_min(uint256(_commitWindowSeconds) + _attestWindowSeconds, type(uint32).max))
            );
        } else {
            (passed, lastBlock, endsAt) = _window(live.sinceBlock, live.sinceTime, _attestWindow, _attestWindowSeconds);
        }
        if (!passed) revert AbortTooEarly(round, lastBlock, endsAt);
        if (live.state == RoundState.OPEN) {
            // its record, as closeRound writes it: it ended here, with the commits it had
            _records[round] = RoundRecord(
                live.sinceBlock,
                uint40(block.number),
                live.participantCount,
                live.sinceTime,
                uint40(block.timestamp)
            );
            _outcome[round] = RESERVED;
        }
        emit RoundAborted(round, msg.sender);
        bytes32 base = live.baseRound == 0 ? _genesisDigest : _outcome[live.baseRound];
        // After an abort the next round awaits everyone (settled 0): the aborted round's sets were
        // never agreed on, and the base's bitmap is not the previous round's.
        _writeLive(Live({
            round: live.round + 1,
            sinceBlock: uint40(block.number),
            sinceTime: uint40(block.timestamp),
            baseRound: live.baseRound,
            participantCount: 0,
            state: RoundState.OPEN,
            priorKept: false,
            committerRemoved: false,
            settled: 0,
            tableSize: live.tableSize,
            leftOutAbsent: 0
        }));
        emit RoundOpened(round + 1, live.baseRound, base);
    }

    /**
     * @notice Post the sha256 digest of the sender's frame for a step of a secure-aggregation
     * round (docs/SECAGG.md "The protocol"): the step's candidates are the frames whose digests
     * the chain took in its window, its set those that at least t members then acknowledge
     * (`acknowledge`), so every member and any auditor see the same sets. Registered, not
     * removed, senders of a swarm deployed for secure aggregation only, once per (round, step)
     * (AlreadyPosted), each in its step's window (`_stepWindow`): KEYS (step 0) and DEALING
     * (step 1) while the round is open, each followed by its acknowledgment window, then the
     * complaint window (`complain`); MASKED as the sender's ordinary commit (after the complaint
     * window, for members that follow the protocol); REVEAL (step 3) after the MASKED acknowledgments, once the round closed. The
     * event is the record; the one slot written per member (`_posted`) only refuses a repeat.
     * @param round the current round
     * @param step 0 KEYS, 1 DEALING, 3 REVEAL
     * @param digest sha256 of the frame, as the sender publishes it
     */
    function postFrame(uint64 round, uint8 step, bytes32 digest) external {
        if (step != KEYS && step != DEALING && step != REVEAL) revert InvalidStep(step);
        if (uint256(digest) <= 1) revert InvalidDigest(digest);
        _posting(round, step);
        emit FramePosted(round, msg.sender, step, digest);
    }

    /**
     * @notice Acknowledge, in the acknowledgment window of step `step` of secure round `round`
     * (see postFrame), the frames of that step the sender fetched and found sound: `fetched` is
     * a bitmap over the round's members (member i: byte i / 8, bit i % 8), at most 512 bytes. The
     * bitmap itself is on chain, not a digest of it, so no acknowledger can show it to some
     * members only: a step's set (U1 for KEYS, U2 for DEALING, U3 for MASKED) is the senders at
     * least t members acknowledged, the same for everyone who reads the chain. Once per round
     * and step.
     * @param round the current round
     * @param step 0 KEYS, 1 DEALING, 2 MASKED: the step whose frames are acknowledged
     * @param fetched the bitmap of the members whose frames of `step` the sender holds
     */
    function acknowledge(uint64 round, uint8 step, bytes calldata fetched) external {
        if (step > MASKED) revert InvalidStep(step);
        if (fetched.length > MAX_ACK_BYTES) revert MalformedBitmap(round, fetched.length, MAX_ACK_BYTES);
        _posting(round, step + ACK_KEYS);
        emit Acknowledged(round, msg.sender, step, fetched);
    }

    /**
     * @notice Complain, in the complaint window of secure round `round` (after the DEALING
     * acknowledgments, before the MASKED commits of members that follow the protocol), against
     * the dealers whose sealed shares for the sender do not open or do not match their
     * commitments: `frame` is the sender's signed COMPLAINT frame, revealing per such dealer the
     * sender's private key of that pair. The frame itself goes on chain, not a digest: a
     * complainer that dies after complaining leaves a complaint everyone can judge, and the
     * verifier reads it from the logs. Costs gas only in a round with a bad dealer. Once per
     * round (AlreadyPosted), registered, not removed, senders of a swarm deployed for secure
     * aggregation only.
     * @param round the current round
     * @param frame the COMPLAINT frame, 1 to 111 + 34 * min(registrations ever made, 4,096) bytes
     * (a round has no more members than that; InvalidComplaint otherwise)
     */
    function complain(uint64 round, bytes calldata frame) external {
        uint256 registrations = _counts.tableSlots / SLOTS_PER_REGISTRATION; // removals do not lower it
        if (registrations > MAX_COMPLAINT_ENTRIES) registrations = MAX_COMPLAINT_ENTRIES;
        uint256 maxLength = COMPLAINT_FIXED_BYTES + COMPLAINT_ENTRY_BYTES * registrations;
        if (frame.length == 0 || frame.length > maxLength) revert InvalidComplaint(round, frame.length, maxLength);
        _posting(round, COMPLAINT);
        emit Complained(round, msg.sender, frame);
    }

    /**
     * @dev The window of secure-aggregation posting `step` (a frame step, or ACK_* for an
     * acknowledgment), in eighths of its phase's window: from the end of eighth `from` through
     * the end of eighth `through` of the commit window (`closed` false: the round is open) or
     * of the attestation window (`closed` true: from the round's closing). The one place the
     * steps are laid out (node/chain/secure_steps.py mirrors it); a new step is a new line.
     */
    function _stepWindow(uint8 step) private pure returns (bool closed, uint64 from, uint64 through) {
        if (step == KEYS) return (false, 0, 1);
        if (step == ACK_KEYS) return (false, 1, 2);
        if (step == DEALING) return (false, 2, 3);
        if (step == ACK_DEALING) return (false, 3, 4);
        if (step == COMPLAINT) return (false, 4, 5);
        if (step == ACK_MASKED) return (true, 0, 2);
        return (true, 2, 4); // REVEAL
    }

    /// @dev The checks every secure-aggregation posting shares: the swarm's policy, the sender,
    /// the round, `step`'s window, and one posting per (round, step, sender), recorded.
    function _posting(uint64 round, uint8 step) private {
        if (!_secureAggregation) revert NotSecureAggregation();
        Peer memory peer = _peers[msg.sender];
        if (!peer.registered) revert NotRegistered(msg.sender);
        if (peer.banned) revert NotAllowed(msg.sender);
        Live memory live = _live;
        if (round != live.round) revert WrongRound(round, live.round);
        (bool closed, uint64 from, uint64 through) = _stepWindow(step);
        bool open = live.state == RoundState.OPEN;
        if (open == closed) {
            if (!open) revert RoundNotOpen(round, live.state); // a step of the open round: its phase is over
            revert StepWindowClosed(round, step, 0, 0); // a step of the closed round: its phase has not begun
        }
        // 64- and 32-bit lengths times at most 8 fit in 256 bits; an eighth of them fits their type again
        uint256 blocks = open ? _commitWindow : _attestWindow;
        uint256 duration = open ? _commitWindowSeconds : _attestWindowSeconds;
        (bool passed, uint64 lastBlock, uint64 endsAt) = _window(
            live.sinceBlock,
            live.sinceTime,
            uint64((blocks * through) / 8),
            uint32((duration * through) / 8)
        );
        if (passed) revert StepWindowClosed(round, step, lastBlock, endsAt);
        if (from > 0) {
            (bool begun, , ) = _window(
                live.sinceBlock,
                live.sinceTime,
                uint64((blocks * from) / 8),
                uint32((duration * from) / 8)
            );
            if (!begun) revert StepWindowClosed(round, step, 0, 0);
        }
        uint256 posted = _posted[msg.sender];
        uint256 bit = uint256(1) << step;
        if (posted >> 8 == round) {
            if (posted & bit != 0) revert AlreadyPosted(round, step, msg.sender);
            posted |= bit;
        } else posted = (uint256(round) << 8) | bit;
        _posted[msg.sender] = posted;
    }

    /// @dev The live slot in one SSTORE (a struct assigned to storage is written field by field:
    /// eleven writes of one slot, about 2,700 gas more). Live's layout, lowest bits first.
    function _writeLive(Live memory live) private {
        uint256 packed = uint256(live.round) |
            (uint256(live.sinceBlock) << 32) |
            (uint256(live.sinceTime) << 72) |
            (uint256(live.baseRound) << 112) |
            (uint256(live.participantCount) << 144) |
            (uint256(live.state) << 168) |
            (live.priorKept ? 1 << 176 : 0) |
            (live.committerRemoved ? 1 << 184 : 0) |
            (uint256(live.settled) << 192) |
            (uint256(live.tableSize) << 216) |
            (uint256(live.leftOutAbsent) << 240);
        Live storage stored = _live;
        assembly ("memory-safe") {
            sstore(stored.slot, packed)
        }
    }

    /**
     * @dev Whether the live round's early close does not await a member whose last commit before
     * it was participant `index` of round `last` (0: never committed), and whether that is because
     * the base round left it out. Only when the previous round was finalized (it is the base):
     * the member committed in it and its winning bitmap left it out; or the round before it was
     * finalized too (`priorKept`), the member committed there, was left out, and sat the base
     * round out. Otherwise (genesis, after an abort, a newcomer, a member absent longer) awaited.
     */
    function _leftOut(
        Live memory live,
        uint32 last,
        uint32 index
    ) private view returns (bool unawaited, bool ofBase) {
        uint256 base = live.baseRound;
        if (base == 0 || base + 1 != live.round || last == 0) return (false, false);
        if (last == base) {
            ofBase = !_wasIncluded(last, index);
            return (ofBase, ofBase);
        }
        if (live.priorKept && uint256(last) + 1 == base) return (!_wasIncluded(last, index), false);
        return (false, false);
    }

    /// @dev Bit `index` of round `round`'s winning bitmap, kept by `_keepIncluded` (the caller
    /// knows it is still there: one of the last two finalized rounds).
    function _wasIncluded(uint32 round, uint32 index) private view returns (bool) {
        uint256 word = _included[(uint256(index >> 8) << 1) | (round & 1)];
        unchecked {
            uint256 local = index & 255; // byte local / 8 of the word's 32 (the first the highest), bit local % 8
            return (word >> (((31 - (local >> 3)) << 3) | (local & 7))) & 1 == 1;
        }
    }

    /**
     * @dev Keep the winning bitmap of `round` (`count` participants, checked by `attest`) in the
     * slots of its parity and return how many participants it left out; `everyone`: keep all
     * ones instead and return 0 (a participant was removed during the round). Bytes past the
     * bitmap's length, which calldataload reads too, are cleared.
     */
    function _keepIncluded(
        uint32 round,
        bytes calldata included,
        uint256 count,
        bool everyone
    ) private returns (uint256 leftOut) {
        unchecked {
            // count < 2^24 and included.length == ceil(count / 8) (checked by attest): nothing wraps
            uint256 words = (count + 255) >> 8;
            uint256 kept = 0;
            for (uint256 w = 0; w < words; ++w) {
                uint256 chunk = type(uint256).max;
                if (!everyone) {
                    assembly ("memory-safe") {
                        chunk := calldataload(add(included.offset, shl(5, w)))
                    }
                    uint256 rest = included.length - (w << 5);
                    if (rest < 32) chunk &= ~((uint256(1) << ((32 - rest) << 3)) - 1);
                    kept += _popcount(chunk);
                }
                _included[(w << 1) | (round & 1)] = chunk;
            }
            return everyone ? 0 : count - kept;
        }
    }

    /// @dev Set bits of `x` (SWAR: pairs, nibbles, bytes, then 16-bit lanes summed by one multiply).
    function _popcount(uint256 x) private pure returns (uint256) {
        unchecked {
            x -= (x >> 1) & 0x5555555555555555555555555555555555555555555555555555555555555555;
            x =
                (x & 0x3333333333333333333333333333333333333333333333333333333333333333) +
                ((x >> 2) & 0x3333333333333333333333333333333333333333333333333333333333333333);
            x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f;
            x = (x + (x >> 8)) & 0x00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff;
            return (x * 0x0001000100010001000100010001000100010001000100010001000100010001) >> 240;
        }
    }

    // Saturating counters: the early-close tallies may count low (a round then waits longer),
    // never wrap or revert.
    function _up24(uint24 v) private pure returns (uint24) {
        return v == type(uint24).max ? v : v + 1;
    }

    function _down24(uint24 v) private pure returns (uint24) {
        return v == 0 ? 0 : v - 1;
    }

    function _up16(uint16 v) private pure returns (uint16) {
        return v == type(uint16).max ? v : v + 1;
    }

    function _down16(uint16 v) private pure returns (uint16) {
        return v == 0 ? 0 : v - 1;
    }

    function _min(uint256 a, uint256 b) private pure returns (uint256) {
        return a < b ? a : b;
    }

    /**
     * @dev Add `digest` to the open round's digests; false if it is there already. With
     * h = keccak256(digest), its buckets are consecutive from h's high bits, and its fingerprint is
     * h's low 74 bits; it goes into the first of its buckets with room (three fingerprints each), so
     * a copy of it is found at or before that bucket (entries leave a bucket only in a later round or
     * phase). A digest is hashed, not cut, because a committer chooses its digest freely: another
     * digest with the same buckets and fingerprint, refused as a duplicate of this one, takes a 2^74
     * keccak search to find once this one is known.
     */
    function _insertDigest(uint64 round, bytes32 digest, uint256 size) private returns (bool) {
        uint256 tag = uint256(round) << 1;
        if (size > 0) {
            uint256 h = uint256(keccak256(abi.encodePacked(digest)));
            uint256 fp = h & MASK74;
            if (fp == 0) fp = 1;
            uint256 start = h >> 128;
            for (uint256 k = 0; k < PROBES; ++k) {
                uint256 bucket = (start + k) % size;
                uint256 entry = _table[bucket];
                if (entry >> 224 != tag) {
                    _table[bucket] = (tag << 224) | (fp << 148);
                    return true;
                }
                uint256 second = (entry >> 74) & MASK74;
                uint256 third = entry & MASK74;
                if ((entry >> 148) & MASK74 == fp || second == fp || third == fp) return false;
                if (second == 0) {
                    _table[bucket] = entry | (fp << 74);
                    return true;
                }
                if (third == 0) {
                    _table[bucket] = entry | fp;
                    return true;
                }
            }
        }
        bytes32 key = keccak256(abi.encodePacked(round, uint8(0), digest));
        if (_overflow[key] != 0) return false;
        _overflow[key] = 1;
        return true;
    }

    /// @dev Add a vote for `key` (keccak256 of aggregate digest and bitmap) in the closed round of
    /// `count` participants and return its votes: the same buckets, with fingerprints of 192 bits.
    /// A vote that makes the majority is not written: the round is over, nobody reads the counter.
    function _vote(uint64 round, bytes32 key, uint256 size, uint256 count) private returns (uint32 votes) {
        uint256 tag = (uint256(round) << 1) | 1;
        uint256 fp = (uint256(key) & ((1 << 192) - 1)) << 32;
        if (size > 0) {
            uint256 start = uint256(key) >> 192;
            for (uint256 k = 0; k < PROBES; ++k) {
                uint256 bucket = (start + k) % size;
                uint256 entry = _table[bucket];
                if (entry >> 224 != tag) {
                    if (2 <= count) _table[bucket] = (tag << 224) | fp | 1;
                    return 1;
                }
                if (entry & ~uint256(type(uint32).max) == (tag << 224) | fp) {
                    votes = uint32(entry) + 1;
                    if (2 * uint256(votes) <= count) _table[bucket] = (tag << 224) | fp | votes;
                    return votes;
                }
            }
        }
        bytes32 okey = keccak256(abi.encodePacked(round, uint8(1), key));
        votes = uint32(_overflow[okey]) + 1;
        if (2 * uint256(votes) <= count) _overflow[okey] = votes;
    }

    /// @dev The votes `_vote` counted for `key` in the live round (0 if none).
    function _votesOf(uint64 round, bytes32 key, uint256 size) private view returns (uint32) {
        uint256 tag = (uint256(round) << 1) | 1;
        uint256 fp = (uint256(key) & ((1 << 192) - 1)) << 32;
        if (size > 0) {
            uint256 start = uint256(key) >> 192;
            for (uint256 k = 0; k < PROBES; ++k) {
                uint256 entry = _table[(start + k) % size];
                if (entry >> 224 != tag) return 0;
                if (entry & ~uint256(type(uint32).max) == (tag << 224) | fp) return uint32(entry);
            }
        }
        return uint32(_overflow[keccak256(abi.encodePacked(round, uint8(1), key))]);
    }

    /**
     * @dev The window that began in block `sinceBlock` at timestamp `sinceTime` and lasts `blocks`
     * blocks and `duration` seconds: whether it has passed, which takes both (blocks alone can be
     * stuffed, a timestamp alone skewed by a block producer within the chain's limits), its last
     * block, and the timestamp it lasts until.
     */
    function _window(
        uint40 sinceBlock,
        uint40 sinceTime,
        uint64 blocks,
        uint32 duration
    ) private view returns (bool passed, uint64 lastBlock, uint64 endsAt) {
        unchecked {
            // 40-bit values plus 64- or 32-bit ones: no overflow in 256 bits
            uint256 last = uint256(sinceBlock) + blocks;
            uint256 end = uint256(sinceTime) + duration;
            return (block.number > last && block.timestamp >= end, uint64(last), uint64(end));
        }
    }

    function _pastState(uint64 round) private view returns (RoundState) {
        return _outcome[round] == RESERVED ? RoundState.ABORTED : RoundState.FINALIZED;
    }

    // ------------------------------------------------------------------ views

    /// @notice The swarm parameters fixed at deployment.
    function params() external view returns (Params memory) {
        return
            Params(
                _minPeers,
                _commitWindow,
                _attestWindow,
                _epsCapMicro,
                _deltaE18,
                _epsStepMicro,
                _recordEpsCapMicro,
                _recordDeltaE18,
                _genesisDigest,
                _allowlistEnabled,
                _deployer,
                _deployBlock,
                _maxSamples,
                _commitWindowSeconds,
                _attestWindowSeconds,
                _secureAggregation
            );
    }

    /// @notice The round in progress (open or closed).
    function currentRound() external view returns (uint64) {
        return _live.round;
    }

    /// @notice The last finalized round (0 before any) and the model digest to start from.
    function lastFinalized() external view returns (uint64 round, bytes32 digest) {
        round = _live.baseRound;
        digest = round == 0 ? _genesisDigest : _outcome[round];
    }

    /// @notice State, block numbers and timestamps, participant count and finalized digest of `round`.
    function roundInfo(uint64 round) external view returns (RoundInfo memory info) {
        Live memory live = _live;
        if (round == 0 || round > live.round) revert WrongRound(round, live.round);
        if (round == live.round && live.state == RoundState.OPEN) {
            return RoundInfo(live.state, live.sinceBlock, 0, 0, live.participantCount, 0, live.sinceTime, 0);
        }
        RoundRecord memory rec = _records[round];
        info = RoundInfo({
            state: live.state,
            openedBlock: rec.openedBlock,
            closedBlock: rec.closedBlock,
            endedBlock: 0,
            participantCount: rec.participantCount,
            finalizedDigest: 0,
            openedAt: rec.openedAt,
            closedAt: rec.closedAt
        });
        if (round == live.round) return info;
        // round r + 1 opened when r ended: the live slot holds that opening while r + 1 is open
        bool nextOpen = round + 1 == live.round && live.state == RoundState.OPEN;
        info.endedBlock = nextOpen ? live.sinceBlock : _records[round + 1].openedBlock;
        info.state = _pastState(round);
        if (info.state == RoundState.FINALIZED) info.finalizedDigest = _outcome[round];
    }

    /// @notice The cumulative epsilon `peer` has committed, in millionths.
    function epsSpent(address peer) external view returns (uint64) {
        return _peers[peer].epsMicro;
    }

    /// @notice The cumulative record-level (DP-SGD) epsilon `peer` has committed, in millionths.
    function recordEpsSpent(address peer) external view returns (uint64) {
        return _peers[peer].recordEpsMicro;
    }

    /// @notice The libp2p peer id `peer` registered (empty if none).
    function peerIdOf(address peer) external view returns (bytes memory) {
        return _peerIds[peer];
    }

    /// @notice How many registered addresses can still commit (removed ones do not count).
    function registeredCount() external view returns (uint256) {
        return _counts.registered;
    }

    /**
     * @notice How many members the early close of the round in progress still waits for: those
     * it awaits (closeRound) that have not committed yet; 0 once it is closed. An upper bound: the
     * tallies may count low, never high.
     */
    function awaitedCount() external view returns (uint256) {
        Live memory live = _live;
        uint256 registered = _counts.registered;
        if (live.state != RoundState.OPEN || live.settled >= registered) return 0;
        return registered - live.settled;
    }

    /**
     * @notice Whether the early close of the round in progress waits for `account`: registered,
     * not removed, not committed in it yet, and not left out of the last finalized aggregate
     * (closeRound says exactly who is not awaited).
     */
    function isAwaited(address account) external view returns (bool) {
        Live memory live = _live;
        Peer memory peer = _peers[account];
        if (live.state != RoundState.OPEN || !peer.registered || peer.banned) return false;
        if (peer.lastCommitRound == live.round) return false;
        (bool unawaited, ) = _leftOut(live, peer.lastCommitRound, peer.lastCommitIndex);
        return !unawaited;
    }

    /// @notice Whether `account` is registered.
    function isRegistered(address account) external view returns (bool) {
        return _peers[account].registered;
    }

    /// @notice Whether `account` may register (always true without an allowlist).
    function isAllowed(address account) external view returns (bool) {
        return !_allowlistEnabled || _allowed[account];
    }

    /// @notice The aggregate digest `round` was finalized with (0 if not finalized).
    function finalizedDigest(uint64 round) external view returns (bytes32) {
        bytes32 out = _outcome[round];
        return out == RESERVED ? bytes32(0) : out;
    }

    /**
     * @notice Votes so far for (aggregateDigest, included) in the round in progress (0 while it is
     * open). A past round's votes are in its Attested events: its counters are not kept.
     * @param round the current round
     * @param aggregateDigest an aggregate digest
     * @param included an inclusion bitmap
     */
    function votesFor(uint64 round, bytes32 aggregateDigest, bytes calldata included) external view returns (uint32) {
        Live memory live = _live;
        if (round != live.round) revert WrongRound(round, live.round);
        if (live.state != RoundState.CLOSED) return 0;
        return _votesOf(round, keccak256(abi.encodePacked(aggregateDigest, included)), live.tableSize);
    }
}
