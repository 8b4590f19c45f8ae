
}

} // namespace mlx::core::cu
