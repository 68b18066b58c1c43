// Package attack holds no code: its tests are the attacker suite of the
// identity boundary. Each plays someone with network reach to every
// service port and shows the attack refused and nothing left behind.
package attack
