// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/**
 * @title PipelinedLedger (prototype)
 * @notice One transaction per member per round: the round ledger of docs/LEDGER.md "One transaction
 * per round". A member's commit of round r + 1 carries its vote on round r (the aggregate digest
 * and inclusion bitmap it computed, which is also the model its update was trained from). A round
 * closes by itself: in the commit that fills the set it awaits, or, once its commit window has
 * passed, in the first commit of the next round. Round r + 1 opens when r closes; r finalizes when
 * a strict majority of its participants voted the same (digest, bitmap), in their r + 1 commits or
 * in a final `vote` (the swarm's last round, a member that leaves). Round r + 1 closes only once r
 * is finalized; a round that no majority finalizes within the attestation window is aborted (anyone)
 * together with the open round trained from it.
 *
 * A prototype measured by scripts/bench_pipelined.py beside SwarmLedger; what it leaves out of
 * SwarmLedger's rules (allow/disallow after deployment, secure aggregation, aborting an open round
 * without quorum) is listed in docs/LEDGER.md. Who the early close awaits follows SwarmLedger's
 * rule a round later (`_finalize`, `_leftOut`). Steady-state storage: a commit rewrites the
 * member's slot, the live slot, the voting slot and one bucket of the digest table, and reads a
 * word of the last finalized bitmap once it is known (all created before: no new slot); the
 * finalizing vote also rewrites that word. Round history (openings, closings, participants, votes,
 * outcomes, finalized digests) is in events only.
 */
contract PipelinedLedger {
    /// @notice The numeric parameters given at deployment (as SwarmLedger's, without secure aggregation).
    struct Settings {
        uint32 minPeers;
        uint64 commitWindow;
        uint64 attestWindow;
        uint64 epsCapMicro;
        uint64 deltaE18;
        uint64 epsStepMicro;
        uint64 recordEpsCapMicro;
        uint64 recordDeltaE18;
        uint32 maxSamples;
        uint32 commitWindowSeconds;
        uint32 attestWindowSeconds;
    }

    // Slot layouts (lowest bits first; the offsets are the constants below), each read and written whole:
    //   member: epsMicro 64 | recordEpsMicro 64 | lastCommitRound 32 | lastVoteRound 32 | registered 8 |
    //     lastCommitIndex 24 (its participant number in lastCommitRound)
    //   live (the open round): round 32 | openedBlock 40 | openedAt 40 | participantCount 24 |
    //     tableSize 24 (buckets of each half of the table) | baseRound 32 (last finalized) | registered 24 |
    //     settled 24 (committed, or not awaited: the early close's tally, counting low if anything) |
    //     leftOutAbsent 16 (members the base left out, not committed in the open round)
    //   voting (the last closed round; it closed when the open round opened): round 32 |
    //     participantCount 24 | pending 8 | priorKept 8 (the round before the base was finalized: its
    //     bitmap is kept) | committed 24 (its participants that committed in the open round while it
    //     was pending) | leaderFp 88 | leaderVotes 24 | leaderSelfIncluded 24 (leader voters, in a
    //     commit, whose bit the bitmap sets)

    error InvalidParams(string name);
    error NotAllowed(address account);
    error NotRegistered(address account);
    error AlreadyRegistered(address account);
    error InvalidPeerId(uint256 length);
    error InvalidSignature(uint256 length);
    error WrongRound(uint64 given, uint64 current);
    error AlreadyCommitted(uint64 round, address peer);
    error CommitWindowClosed(uint64 round);
    error CommitWindowOpen(uint64 round, uint64 lastBlock, uint64 endsAt);
    error QuorumNotMet(uint64 round, uint32 committed, uint32 minPeers);
    /// @notice The round before `round` is not finalized yet: `round` cannot close.
    error PreviousPending(uint64 round);
    error EpsDecreasing(uint64 previousMicro, uint64 givenMicro);
    error EpsNotPolicy(uint64 expectedMicro, uint64 givenMicro);
    error RecordEpsDecreasing(uint64 previousMicro, uint64 givenMicro);
    error RecordEpsOverCap(uint64 givenMicro, uint64 capMicro);
    error EpsOverCap(uint64 givenMicro, uint64 capMicro);
    error InvalidDigest(bytes32 digest);
    error InvalidNumSamples(uint64 numSamples);
    error NumSamplesOverCap(uint64 numSamples, uint32 maxSamples);
    error DuplicateDigest(uint64 round, bytes32 digest);
    /// @notice `round` is not the closed round awaiting its votes.
    error NotVoting(uint64 round);
    error NotParticipant(uint64 round, address account);
    error AlreadyVoted(uint64 round, address peer);
    error MalformedBitmap(uint64 round, uint256 length, uint256 expectedLength);
    error AbortTooEarly(uint64 round, uint64 lastBlock, uint64 endsAt);
    /// @notice A member's first commit must name its mechanism (later ones may leave it empty: unchanged).
    error MissingMechanism(address peer);

    event Registered(address indexed peer, bytes peerId, bytes signature);
    /// @notice Round `round` opened from the model finalized in `baseRound` (round 1 at deployment,
    /// and the round after an abort; `baseDigest` the genesis digest, or 0: the digest is in
    /// baseRound's RoundFinalized event); after a close, RoundClosed(r) is the opening of r + 1.
    event RoundOpened(uint64 indexed round, uint64 baseRound, bytes32 baseDigest);
    /// @notice `peer` committed `digest` as participant `index` of `round`, trained from the aggregate
    /// `voteDigest` of round - 1 with bitmap `included` (its vote on round - 1, counted if it
    /// participated there and had not voted yet; 0 and empty in round 1). An empty `mechanism` is the
    /// one of the member's last commit that named one (a member's first commit names it).
    event Committed(
        uint64 indexed round,
        address indexed peer,
        uint32 index,
        bytes32 digest,
        uint64 numSamples,
        uint64 epsMicro,
        uint64 recordEpsMicro,
        bytes mechanism,
        bytes32 voteDigest,
        bytes included
    );
    /// @notice `peer`'s final vote on `round` (a member that did not commit in the next round).
    event Voted(uint64 indexed round, address indexed peer, bytes32 aggregateDigest, bytes included);
    /// @notice `round` closed with `participantCount` participants; round + 1 opened in this block.
    event RoundClosed(uint64 indexed round, uint32 participantCount);
    /// @notice A strict majority finalized `round`: its (digest, bitmap) is the vote of the same
    /// transaction (a Committed event of round + 1, or a Voted event of round).
    event RoundFinalized(uint64 indexed round);
    /// @notice `round` was aborted, and with it the open round trained from it.
    event RoundAborted(uint64 indexed round, address indexed by);

    uint32 private immutable _minPeers;
    uint64 private immutable _commitWindow;
    uint64 private immutable _attestWindow;
    uint64 private immutable _epsCapMicro;
    uint64 private immutable _epsStepMicro;
    uint64 private immutable _recordEpsCapMicro;
    uint32 private immutable _maxSamples;
    uint32 private immutable _commitWindowSeconds;
    uint32 private immutable _attestWindowSeconds;
    bool private immutable _allowlistEnabled;
    bytes32 private immutable _genesisDigest;

    uint256 private constant PROBES = 3;
    uint256 private constant MASK24 = (1 << 24) - 1;
    uint256 private constant MASK74 = (1 << 74) - 1;
    uint256 private constant MASK88 = (1 << 88) - 1;
    uint256 private constant MASK176 = (1 << 176) - 1;
    // member slot
    uint256 private constant M_LAST_COMMIT = 128;
    uint256 private constant M_LAST_VOTE = 160;
    uint256 private constant M_REGISTERED = 192;
    uint256 private constant M_INDEX = 200;
    // live slot
    uint256 private constant L_OPENED_BLOCK = 32;
    uint256 private constant L_OPENED_AT = 72;
    uint256 private constant L_COUNT = 112;
    uint256 private constant L_TABLE = 136;
    uint256 private constant L_BASE = 160;
    uint256 private constant L_REGISTERED = 192;
    uint256 private constant L_SETTLED = 216;
    uint256 private constant L_LEFT_OUT_ABSENT = 240;
    // voting slot
    uint256 private constant V_COUNT = 32;
    uint256 private constant PENDING = 1 << 56;
    uint256 private constant PRIOR_KEPT = 1 << 64;
    uint256 private constant V_COMMITTED = 72;
    uint256 private constant V_LEADER = 96;
    uint256 private constant V_LEADER_VOTES = 184;
    uint256 private constant V_LEADER_SELF = 208;

    uint256 private _live;
    uint256 private _voting;
    mapping(address => uint256) private _members;
    mapping(address => bool) private _allowed;
    /// @dev Two interleaved tables of buckets created by registrations: slot 2b the digests of the
    /// open round (bucket b: tag 224..255 the round, three 74-bit fingerprints), slot 2b + 1 the
    /// dissenting vote counters of the voting round (tag, a 176-bit fingerprint at 48..223, votes at
    /// 24..47, votes of voters the bitmap includes at 0..23). An entry of another round is free
    /// space. The halves never share a slot: the open round's digests and the previous round's
    /// votes arrive together.
    mapping(uint256 => uint256) private _table;
    mapping(bytes32 => uint256) private _overflow;
    /// @dev The winning bitmaps of the last two finalized rounds, by parity (SwarmLedger's `_included`).
    mapping(uint256 => uint256) private _included;

    constructor(Settings memory settings, bytes32 genesisDigest, address[] memory allowlist) {
        if (settings.minPeers == 0) revert InvalidParams("minPeers");
        if (settings.commitWindow == 0 || settings.commitWindowSeconds == 0) revert InvalidParams("commitWindow");
        if (settings.attestWindow == 0 || settings.attestWindowSeconds == 0) revert InvalidParams("attestWindow");
        if (settings.epsCapMicro == 0 || settings.epsStepMicro > settings.epsCapMicro) {
            revert InvalidParams("epsCapMicro");
        }
        if (uint256(genesisDigest) <= 1) revert InvalidParams("genesisDigest");
        _minPeers = settings.minPeers;
        _commitWindow = settings.commitWindow;
        _attestWindow = settings.attestWindow;
        _epsCapMicro = settings.epsCapMicro;
        _epsStepMicro = settings.epsStepMicro;
        _recordEpsCapMicro = settings.recordEpsCapMicro;
        _maxSamples = settings.maxSamples == 0 ? type(uint32).max : settings.maxSamples;
        _commitWindowSeconds = settings.commitWindowSeconds;
        _attestWindowSeconds = settings.attestWindowSeconds;
        _allowlistEnabled = allowlist.length > 0;
        _genesisDigest = genesisDigest;
        for (uint256 i = 0; i < allowlist.length; ++i) _allowed[allowlist[i]] = true;
        _live = 1 | (block.number << L_OPENED_BLOCK) | (block.timestamp << L_OPENED_AT);
        _voting = 1 << 255; // created here so that the first close rewrites it; round 0: nothing to vote on
        _included[0] = 1; // word 0 of both bitmaps, rewritten by finalizations, never created by one
        _included[1] = 1;
        emit RoundOpened(1, 0, genesisDigest);
    }

    /// @notice Register the sender (as SwarmLedger's `register`): creates its two table slots, and
    /// every 256th registration the next word of both bitmaps.
    function register(bytes calldata peerId, bytes calldata signature) external {
        if (_allowlistEnabled && !_allowed[msg.sender]) revert NotAllowed(msg.sender);
        if (_members[msg.sender] >> M_REGISTERED != 0) revert AlreadyRegistered(msg.sender);
        if (peerId.length == 0 || peerId.length > 128) revert InvalidPeerId(peerId.length);
        if (signature.length > 128) revert InvalidSignature(signature.length);
        _members[msg.sender] = 1 << M_REGISTERED;
        uint256 live = _live;
        uint256 registered = uint24(live >> L_REGISTERED);
        if (registered == MASK24) revert InvalidParams("registered"); // the 24-bit count is full
        _table[2 * registered] = 1;
        _table[2 * registered + 1] = 1;
        if (registered % 256 == 0 && registered > 0) {
            _included[(registered / 256) << 1] = 1;
            _included[((registered / 256) << 1) | 1] = 1;
        }
        _live = live + (1 << L_REGISTERED);
        emit Registered(msg.sender, peerId, signature);
    }

    /**
     * @notice Commit the digest of the update the sender published for `round`, with its vote on
     * round - 1. `round` is the open round, or the one after it once the open round's commit window
     * has passed with its quorum: this commit then closes it first.
     * @param voteDigest the aggregate of round - 1 the sender computed and trained from
     * @param included its inclusion bitmap over round - 1's participants
     */
    function commit(
        uint64 round,
        bytes32 digest,
        uint64 numSamples,
        uint64 epsMicro,
        uint64 recordEpsMicro,
        bytes calldata mechanism,
        bytes32 voteDigest,
        bytes calldata included
    ) external {
        uint256 member = _members[msg.sender];
        if (member >> M_REGISTERED == 0) revert NotRegistered(msg.sender);
        uint256 live = _live;
        uint256 voting = _voting;
        if (round != uint32(live)) {
            if (round != uint32(live) + 1 || !_windowPassed(live)) revert WrongRound(round, uint32(live));
            (live, voting) = _close(live, voting);
        } else if (uint24(live >> L_COUNT) >= _minPeers && _windowPassed(live)) revert CommitWindowClosed(round);
        uint256 last = uint32(member >> M_LAST_COMMIT);
        if (last == round) revert AlreadyCommitted(round, msg.sender);
        if (last == 0 && mechanism.length == 0) revert MissingMechanism(msg.sender);
        _checkSpend(member, digest, numSamples, epsMicro, recordEpsMicro);
        if (!_insertDigest(round, digest, uint24(live >> L_TABLE))) revert DuplicateDigest(round, digest);
        // A participant of the voting round, still pending: its vote (once), and its commit counted
        // as awaited (whether the pending bitmap leaves it out is not known yet: `_finalize`).
        bool early = voting & PENDING != 0 && last == uint32(voting);
        if (early) {
            voting += 1 << V_COMMITTED;
            if (uint32(member >> M_LAST_VOTE) != last) {
                (live, voting) = _countVote(live, voting, voteDigest, included, uint24(member >> M_INDEX), true);
            }
        }
        uint256 index = uint24(live >> L_COUNT);
        _members[msg.sender] =
            uint256(epsMicro) |
            (uint256(recordEpsMicro) << 64) |
            (uint256(round) << M_LAST_COMMIT) |
            (uint256(uint32(member >> M_LAST_VOTE)) << M_LAST_VOTE) |
            (1 << M_REGISTERED) |
            (index << M_INDEX);
        live += 1 << L_COUNT;
        if (early || !_leftOut(live, voting, last, uint24(member >> M_INDEX))) {
            if (uint24(live >> L_SETTLED) != MASK24) live += 1 << L_SETTLED;
        } else if (last == uint32(live >> L_BASE) && uint16(live >> L_LEFT_OUT_ABSENT) != 0) {
            live -= 1 << L_LEFT_OUT_ABSENT; // left out of the base and absent until now
        }
        emit Committed(
            round,
            msg.sender,
            uint32(index),
            digest,
            numSamples,
            epsMicro,
            recordEpsMicro,
            mechanism,
            voteDigest,
            included
        );
        if (_full(live, voting)) (live, voting) = _close(live, voting);
        _live = live;
        _voting = voting;
    }

    /// @notice A final vote on the voting round (a participant that does not commit in the next one).
    function vote(uint64 round, bytes32 aggregateDigest, bytes calldata included) external {
        uint256 member = _members[msg.sender];
        uint256 voting = _voting;
        if (voting & PENDING == 0 || round != uint32(voting)) revert NotVoting(round);
        if (uint32(member >> M_LAST_COMMIT) != round) revert NotParticipant(round, msg.sender);
        if (uint32(member >> M_LAST_VOTE) == round) revert AlreadyVoted(round, msg.sender);
        uint256 live = _live;
        (live, voting) = _countVote(live, voting, aggregateDigest, included, uint24(member >> M_INDEX), false);
        _members[msg.sender] = (member & ~(uint256(type(uint32).max) << M_LAST_VOTE)) | (uint256(round) << M_LAST_VOTE);
        emit Voted(round, msg.sender, aggregateDigest, included);
        // the round before is final now: the open round closes here if it is full or its window passed
        uint256 count = uint24(live >> L_COUNT);
        if (_full(live, voting) || (voting & PENDING == 0 && count >= _minPeers && _windowPassed(live))) {
            (live, voting) = _close(live, voting);
        }
        _live = live;
        _voting = voting;
    }

    /// @notice Close the open round (anyone): its window passed with its quorum, or it awaits nobody
    /// more; the round before it finalized. A fallback: in steady state a commit closes it.
    function closeRound(uint64 round) external {
        uint256 live = _live;
        uint256 voting = _voting;
        if (round != uint32(live)) revert WrongRound(round, uint32(live));
        if (voting & PENDING != 0) revert PreviousPending(round);
        if (!_full(live, voting) && !_windowPassed(live)) {
            (uint64 lastBlock, uint64 endsAt) = _windowEnd(live);
            revert CommitWindowOpen(round, lastBlock, endsAt);
        }
        (_live, _voting) = _close(live, voting);
    }

    /// @notice Abort the voting round once its attestation window passed without a majority (anyone),
    /// and the open round trained from it; the next round opens from the last finalized model.
    function abortRound(uint64 round) external {
        uint256 voting = _voting;
        if (voting & PENDING == 0 || round != uint32(voting)) revert NotVoting(round);
        uint256 live = _live;
        // the voting round closed when the open round opened: its attestation window starts there
        uint256 last = uint40(live >> L_OPENED_BLOCK) + _attestWindow;
        uint256 end = uint40(live >> L_OPENED_AT) + _attestWindowSeconds;
        if (block.number <= last || block.timestamp < end) revert AbortTooEarly(round, uint64(last), uint64(end));
        emit RoundAborted(round, msg.sender);
        emit RoundAborted(uint32(live), msg.sender);
        uint256 base = uint32(live >> L_BASE);
        _voting = uint32(voting); // not pending; an abort keeps no bitmap (PRIOR_KEPT cleared)
        // after an abort every member is awaited again (settled 0): as SwarmLedger
        _live =
            (uint32(live) + 1) |
            (block.number << L_OPENED_BLOCK) |
            (block.timestamp << L_OPENED_AT) |
            (uint256(uint24(live >> L_TABLE)) << L_TABLE) |
            (base << L_BASE) |
            (uint256(uint24(live >> L_REGISTERED)) << L_REGISTERED);
        emit RoundOpened(uint32(live) + 1, uint64(base), base == 0 ? _genesisDigest : bytes32(0));
    }

    // ------------------------------------------------------------------ internals

    function _checkSpend(
        uint256 member,
        bytes32 digest,
        uint64 numSamples,
        uint64 epsMicro,
        uint64 recordEpsMicro
    ) private view {
        uint64 spent = uint64(member);
        uint64 recordSpent = uint64(member >> 64);
        if (_epsStepMicro > 0) {
            if (epsMicro != spent + _epsStepMicro) revert EpsNotPolicy(spent + _epsStepMicro, epsMicro);
        } else if (epsMicro < spent) revert EpsDecreasing(spent, epsMicro);
        if (epsMicro > _epsCapMicro) revert EpsOverCap(epsMicro, _epsCapMicro);
        if (recordEpsMicro < recordSpent) revert RecordEpsDecreasing(recordSpent, recordEpsMicro);
        if (recordEpsMicro > _recordEpsCapMicro) revert RecordEpsOverCap(recordEpsMicro, _recordEpsCapMicro);
        if (uint256(digest) <= 1) revert InvalidDigest(digest);
        if (numSamples == 0) revert InvalidNumSamples(numSamples);
        if (numSamples > _maxSamples) revert NumSamplesOverCap(numSamples, _maxSamples);
    }

    /// @dev Whether the open round awaits nobody more: the round before is final, every member it
    /// awaits committed (`settled` reaches the registered count), more than two thirds of the
    /// registered members committed (SwarmLedger's early close), and the quorum.
    function _full(uint256 live, uint256 voting) private view returns (bool) {
        uint256 count = uint24(live >> L_COUNT);
        uint256 registered = uint24(live >> L_REGISTERED);
        return
            voting & PENDING == 0 &&
            count >= _minPeers &&
            uint24(live >> L_SETTLED) >= registered &&
            3 * count > 2 * registered;
    }

    /// @dev Close the open round in `live` (the voting round must be final) and open the next one,
    /// which does not await the members the last finalized round left out that sat this one out.
    function _close(uint256 live, uint256 voting) private returns (uint256, uint256) {
        uint256 round = uint32(live);
        if (voting & PENDING != 0) revert PreviousPending(uint64(round));
        uint256 count = uint24(live >> L_COUNT);
        if (count < _minPeers) revert QuorumNotMet(uint64(round), uint32(count), _minPeers);
        uint256 absent = uint16(live >> L_LEFT_OUT_ABSENT);
        voting = round | (count << V_COUNT) | PENDING | (voting & PRIOR_KEPT);
        live =
            (round + 1) |
            (block.number << L_OPENED_BLOCK) |
            (block.timestamp << L_OPENED_AT) |
            (uint256(uint24(live >> L_REGISTERED)) << L_TABLE) |
            (uint256(uint32(live >> L_BASE)) << L_BASE) |
            (uint256(uint24(live >> L_REGISTERED)) << L_REGISTERED) |
            (absent << L_SETTLED);
        emit RoundClosed(uint64(round), uint32(count));
        return (live, voting);
    }

    /**
     * @dev Count a vote for (digest, included) in the voting round, from its participant `index`
     * (`inCommit`: carried by a commit of the open round, so the voter committed there before the
     * bitmap was known); finalize the round at a strict majority.
     */
    function _countVote(
        uint256 live,
        uint256 voting,
        bytes32 digest,
        bytes calldata included,
        uint256 index,
        bool inCommit
    ) private returns (uint256, uint256) {
        uint256 round = uint32(voting);
        uint256 count = uint24(voting >> V_COUNT);
        uint256 expected = (count + 7) / 8;
        if (included.length != expected || (count % 8 != 0 && uint8(included[expected - 1]) >> (count % 8) != 0)) {
            revert MalformedBitmap(uint64(round), included.length, expected);
        }
        if (uint256(digest) <= 1) revert InvalidDigest(digest);
        // a voter that committed in the open round and includes itself: not among the left out
        uint256 selfIn = inCommit && (uint8(included[index >> 3]) >> (index & 7)) & 1 == 1 ? 1 : 0;
        uint256 key = uint256(keccak256(abi.encodePacked(digest, included)));
        uint256 fp = key & MASK88;
        if (fp == 0) fp = 1;
        uint256 leader = (voting >> V_LEADER) & MASK88;
        uint256 votes;
        uint256 selfIncluded;
        if (leader == 0 || leader == fp) {
            // the first key voted leads and is counted in the voting slot itself (no other slot)
            votes = (leader == 0 ? 0 : uint24(voting >> V_LEADER_VOTES)) + 1;
            selfIncluded = (leader == 0 ? 0 : uint24(voting >> V_LEADER_SELF)) + selfIn;
            voting =
                (voting & ((1 << V_LEADER) - 1)) |
                (fp << V_LEADER) |
                (votes << V_LEADER_VOTES) |
                (selfIncluded << V_LEADER_SELF);
        } else (votes, selfIncluded) = _voteInTable(uint64(round), key, uint24(live >> L_TABLE), count, selfIn);
        if (2 * votes > count) (live, voting) = _finalize(live, voting, included, selfIncluded);
        return (live, voting);
    }

    /**
     * @dev The voting round in `voting` is finalized with (digest, included): keep the bitmap, and
     * stop awaiting, in the open round, the members it left out that have not committed there. Which
     * of the open round's committers it left out is not known without a loop: every committer of the
     * open round that was a participant is counted as left out except the winning key's voters that
     * the bitmap includes (the others: dissenters, or voters of an earlier final vote), so the tally
     * counts low (a round waits longer), never high.
     */
    function _finalize(
        uint256 live,
        uint256 voting,
        bytes calldata included,
        uint256 selfIncluded
    ) private returns (uint256, uint256) {
        uint256 round = uint32(voting);
        uint256 count = uint24(voting >> V_COUNT);
        uint256 leftOut = count - _keepIncluded(round, included, count);
        uint256 committed = uint24(voting >> V_COMMITTED);
        uint256 unsure = committed > selfIncluded ? committed - selfIncluded : 0;
        uint256 absent = leftOut > unsure ? _min(leftOut - unsure, type(uint16).max) : 0;
        uint256 settled = _min(uint24(live >> L_SETTLED) + absent, MASK24);
        bool priorKept = uint32(live >> L_BASE) + 1 == round;
        live =
            (live & ((1 << L_BASE) - 1)) |
            (round << L_BASE) |
            (uint256(uint24(live >> L_REGISTERED)) << L_REGISTERED) |
            (settled << L_SETTLED) |
            (absent << L_LEFT_OUT_ABSENT);
        voting = (voting & ~(PENDING | PRIOR_KEPT)) | (priorKept ? PRIOR_KEPT : 0);
        emit RoundFinalized(uint64(round));
        return (live, voting);
    }

    /// @dev Whether the open round does not await a member whose last commit was participant `index`
    /// of round `last`: the last finalized round (the base) or, kept too, the one before it left it out.
    function _leftOut(uint256 live, uint256 voting, uint256 last, uint256 index) private view returns (bool) {
        uint256 base = uint32(live >> L_BASE);
        // the open round is base + 2 (the voting round pending) or base + 1; further after an abort
        if (last == 0 || base == 0 || uint32(live) > base + 2) return false;
        if (last != base && (last + 1 != base || voting & PRIOR_KEPT == 0)) return false;
        uint256 word = _included[((index >> 8) << 1) | (last & 1)];
        unchecked {
            uint256 local = index & 255;
            return (word >> (((31 - (local >> 3)) << 3) | (local & 7))) & 1 == 0;
        }
    }

    /// @dev SwarmLedger's `_keepIncluded` without its everyone flag (no removal here): the bitmap
    /// of `round` into the slots of its parity; returns how many it includes.
    function _keepIncluded(uint256 round, bytes calldata included, uint256 count) private returns (uint256 kept) {
        unchecked {
            uint256 words = (count + 255) >> 8;
            for (uint256 w = 0; w < words; ++w) {
                uint256 chunk;
                assembly ("memory-safe") {
                    chunk := calldataload(add(included.offset, shl(5, w)))
                }
                uint256 rest = included.length - (w << 5);
                if (rest < 32) chunk &= ~((uint256(1) << ((32 - rest) << 3)) - 1);
                kept += _popcount(chunk);
                _included[(w << 1) | (round & 1)] = chunk;
            }
        }
    }

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

    /// @dev A dissenting key's votes and its self-included voters, in the odd slots of the table.
    function _voteInTable(
        uint64 round,
        uint256 key,
        uint256 size,
        uint256 count,
        uint256 selfIn
    ) private returns (uint256 votes, uint256 selfIncluded) {
        uint256 tag = uint256(round) << 224;
        uint256 fp = (key & MASK176) << 48;
        if (size > 0) {
            uint256 start = key >> 192;
            for (uint256 k = 0; k < PROBES; ++k) {
                uint256 slot = 2 * ((start + k) % size) + 1;
                uint256 entry = _table[slot];
                if (entry >> 224 != round) {
                    _table[slot] = tag | fp | (1 << 24) | selfIn;
                    return (1, selfIn);
                }
                if (entry & ~uint256((1 << 48) - 1) == tag | fp) {
                    votes = uint24(entry >> 24) + 1;
                    selfIncluded = uint24(entry) + selfIn;
                    if (2 * votes <= count) _table[slot] = tag | fp | (votes << 24) | selfIncluded;
                    return (votes, selfIncluded);
                }
            }
        }
        bytes32 okey = keccak256(abi.encodePacked(round, uint8(1), key));
        uint256 stored = _overflow[okey];
        votes = uint24(stored >> 24) + 1;
        selfIncluded = uint24(stored) + selfIn;
        if (2 * votes <= count) _overflow[okey] = (votes << 24) | selfIncluded;
    }

    /// @dev SwarmLedger's `_insertDigest` in the even slots: false if `digest` is there already.
    function _insertDigest(uint64 round, bytes32 digest, uint256 size) private returns (bool) {
        uint256 tag = uint256(round);
        if (size > 0) {
            uint256 h = uint256(keccak256(abi.encodePacked(digest)));
            uint256 fp = h & MASK74;
            if (fp == 0) fp = 1;
            uint256 start = h >> 128;
            for (uint256 k = 0; k < PROBES; ++k) {
                uint256 slot = 2 * ((start + k) % size);
                uint256 entry = _table[slot];
                if (entry >> 224 != tag) {
                    _table[slot] = (tag << 224) | (fp << 148);
                    return true;
                }
                uint256 second = (entry >> 74) & MASK74;
                uint256 third = entry & MASK74;
                if ((entry >> 148) & MASK74 == fp || second == fp || third == fp) return false;
                if (second == 0) {
                    _table[slot] = entry | (fp << 74);
                    return true;
                }
                if (third == 0) {
                    _table[slot] = entry | fp;
                    return true;
                }
            }
        }
        bytes32 key = keccak256(abi.encodePacked(round, uint8(0), digest));
        if (_overflow[key] != 0) return false;
        _overflow[key] = 1;
        return true;
    }

    function _windowPassed(uint256 live) private view returns (bool) {
        (uint64 lastBlock, uint64 endsAt) = _windowEnd(live);
        return block.number > lastBlock && block.timestamp >= endsAt;
    }

    function _windowEnd(uint256 live) private view returns (uint64 lastBlock, uint64 endsAt) {
        return (
            uint64(uint40(live >> L_OPENED_BLOCK) + _commitWindow),
            uint64(uint40(live >> L_OPENED_AT) + _commitWindowSeconds)
        );
    }

    function _min(uint256 a, uint256 b) private pure returns (uint256) {
        return a < b ? a : b;
    }

    // ------------------------------------------------------------------ views

    /// @notice The open round.
    function currentRound() external view returns (uint64) {
        return uint32(_live);
    }

    /// @notice The last closed round, and whether it still awaits its majority (pending).
    function votingRound() external view returns (uint64 round, bool pending, uint32 participantCount) {
        uint256 voting = _voting;
        return (uint32(voting), voting & PENDING != 0, uint24(voting >> V_COUNT));
    }

    /// @notice The last finalized round (0 before any); its digest is in its RoundFinalized event.
    function lastFinalized() external view returns (uint64) {
        return uint32(_live >> L_BASE);
    }

    /// @notice The open round's participants so far, the members its early close counts as settled
    /// (committed, or not awaited: a lower bound), and the registered members.
    function openRoundCounts() external view returns (uint32 participants, uint32 settled, uint32 registered) {
        uint256 live = _live;
        return (uint24(live >> L_COUNT), uint24(live >> L_SETTLED), uint24(live >> L_REGISTERED));
    }

    /// @notice The cumulative epsilon `peer` has committed, in millionths.
    function epsSpent(address peer) external view returns (uint64) {
        return uint64(_members[peer]);
    }
}
