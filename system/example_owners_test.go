package system_test

import (
	"context"
	"fmt"
	"log"
)

// An owner of charges keeps named reservations under its owner name at a
// location, beside the values there (the loader cache of package
// system/cache is built this way). Here a component claims the owner
// "scratch", reserves 40 KiB of cuda:0 and reads what it charges there.
func ExampleSystem_Owners() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	o := sys.Owners()
	if !o.Register("scratch", nil) { // nil: it offers no charge as a victim
		log.Fatal("owner name taken")
	}
	fmt.Println("taken again:", !o.Register("scratch", nil))
	if err := o.Reserve(ctx, "cuda:0", "scratch", "scratch/buf", 40<<10); err != nil {
		log.Fatal(err)
	}
	ch, err := o.Charges(ctx, "cuda:0", "scratch")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("owned %d of %d bytes\n", ch.OwnedBytes, ch.BudgetBytes)
	if err := o.Unreserve("scratch", "scratch/buf"); err != nil {
		log.Fatal(err)
	}
	ch, _ = o.Charges(ctx, "cuda:0", "scratch")
	fmt.Println("after unreserve:", ch.OwnedBytes)
	// Output:
	// taken again: true
	// owned 40960 of 65536 bytes
	// after unreserve: 0
}
