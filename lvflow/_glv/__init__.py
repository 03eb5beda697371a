"""The Lotka–Volterra reduction (§3), its systems, diffrax solver pieces, solution and closed forms."""
