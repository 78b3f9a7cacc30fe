package budget

// Taken charges: a loader cache ranks its idle entries by the last time a
// lease was taken on them (a load or a hit), not by when they went idle.

// takeStamp is where a charge's entry was last taken: the location's
// inflation L and the ledger's version at that moment.
type takeStamp struct {
	prio    int64
	version uint64
	set     bool
}

// TouchCharge records that a lease was taken on the entry of owner's
// charge name (a load that settled, a hit): its next offer ranks it as
// of now — priority H = L(location now) + freq, last use this version —
// and after every charge touched before it, whatever the order in which
// the entries go idle. Touches are ordered by the calls: of two charges
// touched at one version, the one touched later ranks later. A charge
// never touched ranks by its offer ([Ledger.OfferCharge]). An offered
// charge touched keeps its place until it is offered again. No version.
//
// Errors (nothing changed): invalid input (an owner that is not a
// cache's, a charge not active or of another owner).
func (l *Ledger) TouchCharge(name, owner string) error {
	r, err := l.ownedCharge(name, owner)
	if err != nil {
		return err
	}
	r.taken = takeStamp{prio: l.locs[r.loc].inflation, version: l.version, set: true}
	offered := r.state == ChargeOffered
	if offered {
		l.unofferIndex(r)
	}
	l.nextCharge++
	r.seq = l.nextCharge
	if offered {
		r.key.id = chargeIDBit | r.seq
		l.offerIndex(r)
	}
	return nil
}
