"""The oracle: Hugging Face's maths exactly, a float64 truth, and the differential engine around them."""
