"""The one constant every path of the ECOC math shares."""

# Floor on ||z||^2 (not on ||z||) in u = z * rsqrt(max(||z||^2, EPSILON)).
# The kernels (as their `epsilon` argument), the streaming paths and the dense
# math all use it, so that they agree to float32 rounding, around z = 0 too.
EPSILON = 1e-12
